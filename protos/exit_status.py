"""`tulip serve`'s exit statuses that `ivy up` acts on: a contract between the two processes, as protos/framing.py's
port offset is (Ivy never imports tulip)."""

DEVICE_LOST_EXIT = 3  # its device stopped running work (tulip.device_check); `ivy up` starts such a Tulip again
