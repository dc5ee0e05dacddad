"""Agent tools: what each one's command line looks like, and who confines it.

    command  a generic command, confined by the engine
    claude   Claude Code, confined by the engine (bubblewrap / Landlock lane);
             its permission mode is policy (claude.py)
    codex    Codex CLI, confined by its own sandbox, composed and pinned by the
             engine per run (codex.py)

The built-in loop has a slot kind in the schema but no adapter in this build;
a run on such a slot is refused by :func:`saphan.engine.Engine.run` with a
message saying so. docs/tools.md has the whole picture.
"""

TOOLS = ("command", "claude", "codex", "loop")
DISPATCHABLE = ("command", "claude", "codex")
AGENT_TOOLS = ("claude", "codex")
