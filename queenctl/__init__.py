"""queenctl: the operator's command line for a queen-broker, over its HTTP API."""
