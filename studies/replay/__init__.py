"""The replay studies' code, one idea a module, under the command studies/study_replay.py (its
docstring: the studies, the arms, the commands, the archive). arms: the arms, the families and
the runs a seed needs; runner: a run of rlep.py (running it, finished, stale or archived, its
machine, start and curve); intervals: t-intervals, p-values, Holm and the plan's words;
mechanism: visits, matched next visits, rescues; compute: generated responses, equal compute,
metering; tables: the report's tables both studies share; offpolicy_report and dynamic_report:
each study's report; plots: the figures; archiving: the archive across sittings."""
import os
import sys

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if repo not in sys.path:  # rlep.py and machinery/, for a module imported without the driver
    sys.path.insert(0, repo)
