"""Feature checks run in a fresh venv holding one extra of distfusion (tests/test_extras.py).

Each ``check_<extra>.py`` is a script run by that venv's Python, from outside
the repository: it imports only distfusion and what the extra installs.
"""
