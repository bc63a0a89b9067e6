"""SQL of the ephemeral queues' declared configuration (migration 0014,
``queen.ephemeral_queues``): one row per declared queue, its options by wire name. Only
configure, delete and the start-up load touch it; the data path never does."""

DECLARED = "SELECT name, options FROM queen.ephemeral_queues ORDER BY name"
"""Every declared queue and its stored knobs."""

DECLARE = """
INSERT INTO queen.ephemeral_queues AS e (name, options)
VALUES ($1, jsonb_strip_nulls($2::jsonb))
ON CONFLICT (name) DO UPDATE
   SET options = jsonb_strip_nulls(e.options || $2::jsonb), updated_at = now()
RETURNING options
"""
"""Declare queue $1 with the knobs $2 (wire names; a null knob goes back to the default):
merged over what was stored, in one statement; answers the stored knobs."""

FORGET = "DELETE FROM queen.ephemeral_queues WHERE name = $1 RETURNING true"
"""Forget queue $1's declaration; a row when there was one."""
