"""Development credentials for `make run`: made once, kept in `.jobq/dev.env` (git-ignored).

`python -m infra.devkeys` prints shell lines exporting `JOBQ_API_KEYS` (an admin of every
tenant, `admin:*:<key>`, and a submit key of the tenant `default`), `QUEUE_INTERNAL_TOKEN`,
`JOBQ_KEY` (the admin key, for curl), `GRAFANA_ADMIN_PASSWORD` (for infra/compose.yml), and
the AWS variables that point boto3 and the AWS CLI at the SQS endpoint with the admin key
(`AWS_ACCESS_KEY_ID`: the key's id, `AWS_SECRET_ACCESS_KEY`: the key, `AWS_DEFAULT_REGION`,
`AWS_ENDPOINT_URL_SQS`; README "SQS compatibility").
"""

from __future__ import annotations

import hashlib
import secrets
import shlex
import sys
from pathlib import Path

ENV_FILE = Path(__file__).resolve().parent.parent / ".jobq" / "dev.env"
SQS_ENDPOINT = "http://127.0.0.1:9324"
SQS_REGION = "jobq-local-1"


def aws_variables(key: str) -> dict[str, str]:
    """The AWS SDK variables that sign with API key `key` at `make run`'s SQS endpoint: the
    access key id names the key (the first 12 hex digits of its SHA-256), the key is the
    secret."""
    return {
        "AWS_ACCESS_KEY_ID": hashlib.sha256(key.encode()).hexdigest()[:12],
        "AWS_SECRET_ACCESS_KEY": key,
        "AWS_DEFAULT_REGION": SQS_REGION,
        "AWS_ENDPOINT_URL_SQS": SQS_ENDPOINT,
    }


def load_or_create(path: Path = ENV_FILE) -> dict[str, str]:
    """The development credentials in `path`, created with fresh random keys if absent."""
    if path.exists():
        pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        values = {key: shlex.split(value)[0] for key, value in pairs}
        if {"JOBQ_API_KEYS", "QUEUE_INTERNAL_TOKEN", "JOBQ_KEY"} <= values.keys():
            if "GRAFANA_ADMIN_PASSWORD" not in values:
                # Files made before Grafana joined compose: keep their keys, add the password.
                values["GRAFANA_ADMIN_PASSWORD"] = secrets.token_urlsafe(18)
                _write(path, values)
            return values
    admin, submit = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    values = {
        "JOBQ_API_KEYS": f"admin:*:{admin},submit:default:{submit}",
        "QUEUE_INTERNAL_TOKEN": secrets.token_urlsafe(24),
        "JOBQ_KEY": admin,
        "JOBQ_SUBMIT_KEY": submit,
        "GRAFANA_ADMIN_PASSWORD": secrets.token_urlsafe(18),
    }
    _write(path, values)
    return values


def _write(path: Path, values: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()))
    path.chmod(0o600)


def main() -> None:
    """Print `export` lines for the shell; a note for the user goes to stderr."""
    values = load_or_create()
    for key, value in {**values, **aws_variables(values["JOBQ_KEY"])}.items():
        print(f"export {key}={shlex.quote(value)}")
    print(
        f"jobq: development keys (kept in {ENV_FILE}): admin {values['JOBQ_KEY']}"
        f"  submit {values['JOBQ_SUBMIT_KEY']}  internal token {values['QUEUE_INTERNAL_TOKEN']}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
