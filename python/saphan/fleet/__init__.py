"""The fleet: machines, slots, delivery of the launcher, probes and facts.

    machines.py  add / list / remove machines; their signed facts
    slots.py     slots, max_sessions, agent pins, holders
    delivery.py  saphan-launcher to SSH machines (digest verified there)
    probes.py    the only writers of measured facts (the Landlock level)
"""
