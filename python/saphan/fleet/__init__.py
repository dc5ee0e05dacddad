"""The fleet: machines, slots, labels, delivery of the launcher, probes and facts.

    machines.py  add / list / remove machines; their signed facts
    slots.py     slots, max_sessions, agent pins, holders
    labels.py    key=value labels of machines and slots, and matching them
    delivery.py  saphan-launcher to SSH machines (digest verified there)
    probes.py    the only writers of measured facts (the Landlock level)
"""
