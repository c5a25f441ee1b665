"""Alembic environment for the project's own tables (Optuna migrates its tables itself)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from lm_tuner.tuner.store.engine import VERSION_TABLE, engine_for
from lm_tuner.tuner.store.schema import Base


def include_object(obj, name, type_, reflected, compare_to) -> bool:
    """Only the project's tables: Optuna's live in the same database and are none of our business."""
    return type_ != "table" or name.startswith("lmt_")


def run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE,
                      include_object=include_object, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    with engine_for(context.config.get_main_option("sqlalchemy.url")).connect() as new_connection:
        run(new_connection)
