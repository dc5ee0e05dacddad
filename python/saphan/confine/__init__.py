"""Confinement: one Policy per run, rendered for each mechanism.

    policy.py    the Policy value (what is writable, what is denied)
    grants.py    derives the grants from the working directory (never typed)
    bwrap.py     Policy -> bubblewrap argv          (Linux control plane)
    seatbelt.py  Policy -> Seatbelt profile          (macOS control plane)
    landlock.py  Policy -> saphan-launcher JSON      (remote runners)
    compose.py   picks the mechanism for this host, or refuses
"""
