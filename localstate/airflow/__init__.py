"""Airflow integration: state-enabled triggers, the provider entry point, the example.

Imported only when used: `localstate` itself never imports Airflow.

* `localstate.airflow.trigger.StateEnabledTrigger`: a mixin for ``BaseEventTrigger``
  subclasses (``get_watermark``/``set_watermark``, ``self.state``, and
  ``self.asset_state_store`` served by the local cache);
* `localstate.airflow.provider.get_provider_info`: the ``apache_airflow_provider`` entry point
  that declares the ``[localstate]`` config section and the DB manager;
* `localstate.airflow.plugin.LocalStatePlugin`: the ``airflow.plugins`` entry point: the API
  and state page in Airflow's API server (`mount`, `serving`, `auth`) and UI;
* `localstate.airflow.db_manager.LocalStateDBManager`: ``airflow db migrate`` runs the
  Alembic revisions in `localstate.airflow._migrations`.
"""
