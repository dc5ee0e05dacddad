"""saphan's own agent loop, for local model lanes (docs/loop.md).

Two halves, on either side of the boundary:

    adapter.py   OUTSIDE the jail (the engine's process): resolves the lane,
                 reads its credential under custody, writes the run's spec,
                 and asks the same composer that jails Claude Code for the
                 boundary — with every lane credential file and the lanes
                 file read-denied, the credential variables scrubbed from the
                 environment, and the key handed over on a pipe.
    agent.py     INSIDE the jail (``python -I -m saphan.loop.agent SPEC``):
                 reads the key from its stdin pipe to EOF, makes itself
                 non-dumpable, then drives the model (client.py) through tool
                 calls (tools.py) until it finishes or a budget ends.

The inside half imports only the standard library and these modules.
"""
