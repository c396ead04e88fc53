"""The test project's settings: its database comes from SHOP_DATABASE_URL."""

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ["SHOP_DATABASE_URL"])

SECRET_KEY = "only-for-the-tests"
USE_TZ = True
INSTALLED_APPS = ["pgqueue.integrations.django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname,
        "PORT": _url.port,
    }
}
PGQUEUE = {
    "HANDLERS": "shop.tasks:tasks",
    "CONCURRENCY": 4,
    "POLL_INTERVAL_SECONDS": 0.2,
}
