"""Recurring schedules: cron and interval timing (pure), and the materialiser that turns their
occurrences into ordinary jobs."""
