"""Agent tools: what each one's command line looks like, and who confines it.

    command  a generic command, confined by the engine
    claude   Claude Code, confined by the engine (bubblewrap / Landlock boundary);
             its permission mode is policy (claude.py)
    codex    Codex CLI, confined by its own sandbox, composed and pinned by the
             engine per run (codex.py)

    loop     saphan's own agent loop on a local model lane, confined by the
             engine like claude and blinded to every lane's credential
             (saphan.loop; docs/loop.md)

docs/tools.md has the whole picture.
"""

TOOLS = ("command", "claude", "codex", "loop")
DISPATCHABLE = ("command", "claude", "codex", "loop")
AGENT_TOOLS = ("claude", "codex", "loop")
