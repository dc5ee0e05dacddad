"""Confinement: one Policy per run, rendered for each mechanism.

    policy.py    the Policy value (what is writable, what is denied)
    grants.py    derives the grants from facts a run cannot forge (never typed);
                 the grant rule itself is rust/core's check_grant_dir
    nofollow.py  saphan's own reads and writes where a run could plant links
    protected.py files other tools load or execute later (.envrc, .vscode, …)
    environment.py  the jail's environment, an allow-list
    bwrap.py     Policy -> bubblewrap argv          (Linux control plane)
    seatbelt.py  Policy -> Seatbelt profile          (macOS control plane)
    landlock.py  Policy -> saphan-launcher JSON      (remote runners)
    compose.py   picks the mechanism for this host, or refuses
"""
