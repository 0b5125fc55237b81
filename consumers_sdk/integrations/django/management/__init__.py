"""Django finds the app's commands in ``management/commands/``."""
