"""Queen-compatible message broker on PostgreSQL: the HTTP face and the storage."""
__version__ = "0.2.0"
