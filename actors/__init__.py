"""Actors running on the asyncio event loop, with pykka's API."""
