"""The soak test's parts (tools/soak.py is the command and says what it does)."""
