"""The leaves every layer may use: configuration, logging, telemetry, the acceptance rule,
the payload cipher, ids and times, and the domain types."""
