"""Agent tools: what each one's command line looks like, and who confines it.

    command  a generic command, confined by the engine (this build)

Claude Code, Codex CLI and the built-in loop have slots in the schema; their
adapters are not in this build, and a run on such a slot is refused by
:func:`saphan.engine.Engine.run` with a message saying so.
"""

TOOLS = ("command", "claude", "codex", "loop")
DISPATCHABLE = ("command",)
