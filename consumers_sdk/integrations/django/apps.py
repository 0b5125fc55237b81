"""The Django app's configuration: a label of its own rather than the package's last name
(``django``), which would read as Django's own."""

from __future__ import annotations

from django.apps import AppConfig


class ConsumersSdkConfig(AppConfig):
    name = "consumers_sdk.integrations.django"
    label = "consumers_sdk"
    verbose_name = "Delay dispatcher consumers"
