"""Queen's wire format: request parsing (coded 400s) and response shaping."""
