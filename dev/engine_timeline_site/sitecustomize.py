"""Imported at every Python start under ``dev/engine_timeline.py run``: times the Whisper engine."""
import os
import sys

if os.environ.get("OSTINATO_TIMELINE_DIR"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import engine_timeline

    engine_timeline.start_recording(os.environ["OSTINATO_TIMELINE_DIR"])

if os.environ.get("OSTINATO_SWITCH_INTERVAL"):  # an A/B of the interpreter's thread switch interval
    sys.setswitchinterval(float(os.environ["OSTINATO_SWITCH_INTERVAL"]))
