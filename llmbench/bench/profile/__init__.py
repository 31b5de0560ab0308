"""``llmbench profile``: where each variant's step time goes.

execute.py runs every variant in its own process (``llmbench run`` with hidden options); in that process
window.py decides which measured steps torch.profiler records (engine/tracer.py writes one trace per
rank), and summary.py reads the traces (trace.py) into the variant's ``profile.json``. diff.py compares
two variants' profiles; views.py turns profiles and comparisons into report tables.
"""
