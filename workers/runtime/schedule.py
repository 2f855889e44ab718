"""Periodic jobs for Celery beat, from the settings.

`KENNING_SCHEDULE` is a JSON object of named entries, each with a `task` name, either
`every_s` (seconds) or `cron` (five fields: minute hour day-of-month month day-of-week),
and optional `arguments` (the task's keyword arguments). The default runs
`kenning.maintenance` every hour. Start beat with

    celery -A kenning.workers.celery.app beat --loglevel INFO
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

DEFAULT_SCHEDULE: dict[str, dict[str, Any]] = {
    "kenning-maintenance": {"task": "kenning.maintenance", "every_s": 3600},
}


class ScheduleEntry(BaseModel):
    task: str
    every_s: float | None = Field(default=None, gt=0)
    cron: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the task")

    @model_validator(mode="after")
    def _one_timing(self) -> ScheduleEntry:
        if (self.every_s is None) == (self.cron is None):
            raise ValueError("a schedule entry needs exactly one of every_s or cron")
        if self.cron is not None and len(self.cron.split()) != 5:
            raise ValueError(f"cron {self.cron!r} must have five fields")
        return self

    def timing(self) -> Any:
        if self.cron is None:
            return self.every_s
        # Celery is imported here: settings load in embedded mode, where it may not be installed.
        from celery.schedules import crontab

        minute, hour, day_of_month, month, day_of_week = self.cron.split()
        return crontab(minute, hour, day_of_week, day_of_month, month)


def beat_schedule(entries: dict[str, ScheduleEntry]) -> dict[str, dict[str, Any]]:
    """Celery's `beat_schedule` for the entries."""
    return {
        name: {"task": entry.task, "schedule": entry.timing(), "kwargs": entry.arguments}
        for name, entry in entries.items()
    }
