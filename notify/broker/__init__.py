"""The broker process: connections, command handlers, lifecycle."""
