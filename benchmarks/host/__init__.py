"""One machine's CPU shared by roles: cores, torch threads, Python's garbage-collector pauses."""
