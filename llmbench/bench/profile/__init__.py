"""``llmbench profile``: where each variant's step time goes.

execute.py runs every variant in its own process (``llmbench run`` with hidden options); in that process
window.py decides which measured steps torch.profiler records (engine/tracer.py writes one trace per
rank), and summary.py reads the traces (trace.py) into the variant's ``profile.json``, to which
reference.py adds how many untraced steps each untraced median is over. diff.py compares two variants'
profiles; views.py turns profiles and comparisons into report tables, and caveats.py adds what the run
folder beside a profile says (its busy-machine warnings, why it stopped) and what the figures stand on.
"""
