"""`saphan serve`: a read-only web view of the workspace's store.

    access.py   the bind (loopback unless --allow-remote), the per-start
                token, the Host check, the startup line
    params.py   every request parameter, checked against its shape before
                anything is read (a bad one is a 400 naming it)
    reader.py   what the pages show, read through the Engine's API (records
                verified with the record key; nothing dialled, nothing written)
    html.py     the pages: server-rendered HTML, every value escaped; the one
                small script and style sheet, served from constants
    app.py      the Starlette application: routes, the token gate, headers
    server.py   binding, the startup line, uvicorn

Starlette and uvicorn are the optional extra ``saphan[serve]``; nothing here
imports them until `saphan serve` runs. docs/dashboard.md is the operator's
guide.
"""
