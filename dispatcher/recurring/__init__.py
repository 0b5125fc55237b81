"""Recurring schedules, pure: cron and interval timing, their occurrences, the stored model. The
materialiser (``dispatcher.recurring.materialiser``) turns occurrences into ordinary jobs."""
