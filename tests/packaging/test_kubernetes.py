"""The Kubernetes deployment (``deploy/kubernetes/``): the values file passes the official
Airflow Helm chart's schema, the Secrets and the workloads the values file describes are valid
Kubernetes objects, and the settings each component gets are the ones localstate accepts, in
the right component only.

The chart's own files are in ``tests/data/airflow-chart-1.21.0/`` (its README says from where):
the values file is validated with its ``values.schema.json`` (``jsonschema``), and the
workloads are built here as its templates place these values (a component's ``env`` through
the ``container_extra_envs`` helper, whose text is checked to be the one mirrored; the
triggerer a StatefulSet whose persistent volume is mounted at the logs folder; the API server
a Deployment of ``replicas`` pods; the Celery workers a StatefulSet with the tasks'
connection), then validated against the Kubernetes schema (kubernetes-validate, offline,
strict: an unknown field fails). The chart itself is not rendered: ``helm`` is in neither PyPI
nor Debian 12.

A pod's files are emulated (`Pod`): its Secret volumes hold secrets.yaml's keys, its init
containers run (the triggerers' ``localstate credential``), and its settings are resolved as
localstate resolves them there. The hardening page's checklist runs over that example
(`CHECKLIST`), and the image's Dockerfile and build context are checked against the constraints
and the one wheel it installs.
"""

from __future__ import annotations

import asyncio
import fnmatch
import gzip
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from localstate_cli import localstate_command

from localstate._core.config import Settings, default_triggerer_id
from localstate._core.triggerer_credential import derive
from localstate.api._auth import Authorizer

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
#: the Kubernetes version the objects are validated against (kubernetes-validate ships it)
KUBERNETES = "1.31.0"
RELEASE = "airflow"
#: where the chart mounts a triggerer's own volume (its logs folder, under airflowHome)
TRIGGERER_VOLUME = "/opt/airflow/logs"
#: the chart's files the tests read (README.md there: source, commit, version)
CHART = ROOT / "tests" / "data" / "airflow-chart-1.21.0"
#: the chart's `container_extra_envs` helper (templates/_helpers.yaml), which renders a
#: component's `env`: a value, else a secretKeyRef, else a configMapKeyRef, nothing else.
#: `chart_env` mirrors it; a test checks the vendored helper is still this text
EXTRA_ENVS_HELPER = """\
{{- define "container_extra_envs" -}}
  {{- $ := index . 0 -}}
  {{- $env := index . 1 -}}
  {{- range $i, $config := $env }}
  - name: {{ $config.name }}
    {{- if $config.value }}
    value: {{ $config.value | quote }}
    {{- else if $config.valueFrom }}
    valueFrom:
      {{- if $config.valueFrom.secretKeyRef }}
      secretKeyRef:
        name: {{ $config.valueFrom.secretKeyRef.name }}
        key: {{ $config.valueFrom.secretKeyRef.key }}
      {{- else if $config.valueFrom.configMapKeyRef }}
      configMapKeyRef:
        name: {{ $config.valueFrom.configMapKeyRef.name }}
        key: {{ $config.valueFrom.configMapKeyRef.key }}
      {{- end }}
    {{- end }}
  {{- end }}
{{- end }}
"""


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "values.yaml").read_text())
    return loaded


def secrets() -> dict[str, dict[str, str]]:
    """Secret name -> its string data."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "secrets.yaml").read_text()) if d]
    return {d["metadata"]["name"]: d["stringData"] for d in docs}


def chart_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(
        gzip.decompress((CHART / "values.schema.json.gz").read_bytes()))
    return schema


def schema_errors(v: dict[str, Any]) -> list[str]:
    """Where and why the chart's schema refuses `v` (what `helm install` stops on)."""
    schema = chart_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message[:200]}"
                  for e in validator.iter_errors(v))


def chart_env(env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the chart's `container_extra_envs` renders of a component's `env`."""
    out: list[dict[str, Any]] = []
    for config in env:
        item: dict[str, Any] = {"name": config["name"]}
        source = config.get("valueFrom") or {}
        if config.get("value"):
            item["value"] = str(config["value"])
        elif source.get("secretKeyRef"):
            ref = source["secretKeyRef"]
            item["valueFrom"] = {"secretKeyRef": {"name": ref["name"], "key": ref["key"]}}
        elif source.get("configMapKeyRef"):
            ref = source["configMapKeyRef"]
            item["valueFrom"] = {"configMapKeyRef": {"name": ref["name"], "key": ref["key"]}}
        elif source:
            item["valueFrom"] = None  # rendered as `valueFrom:` with nothing under it
        out.append(item)
    return out


def image(v: dict[str, Any]) -> str:
    return f"{v['images']['airflow']['repository']}:{v['images']['airflow']['tag']}"


def mounts(v: dict[str, Any], component: dict[str, Any],
           own: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A component's main container's mounts as the chart places them: its
    `extraVolumeMounts`, the top-level `volumeMounts` (every Airflow container), its own."""
    return [*component.get("extraVolumeMounts", []), *v.get("volumeMounts", []), *own]


def container(name: str, v: dict[str, Any], component: dict[str, Any],
              own_mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "image": image(v), "args": ["bash", "-c", f"exec airflow {name}"],
            "env": chart_env(component["env"]), "resources": component["resources"],
            "volumeMounts": mounts(v, component, own_mounts)}


def templated(v: dict[str, Any], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`tpl` of the extra containers: the one template the values use, the image's."""
    text = json.dumps(items).replace('{{ template \\"airflow_image\\" . }}', image(v))
    assert "{{" not in text, text
    rendered: list[dict[str, Any]] = json.loads(text)
    return rendered


def pod_spec(v: dict[str, Any], component: dict[str, Any],
             main: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [main]}
    if component.get("extraInitContainers"):
        spec["initContainers"] = templated(v, component["extraInitContainers"])
    volumes = [*v.get("volumes", []), *component.get("extraVolumes", [])]
    if volumes:
        spec["volumes"] = volumes
    return spec


def triggerer_statefulset(v: dict[str, Any]) -> dict[str, Any]:
    t = v["triggerer"]
    labels = {"component": "triggerer", "release": RELEASE}
    main = container("triggerer", v, t, [{"name": "logs", "mountPath": TRIGGERER_VOLUME}])
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": f"{RELEASE}-triggerer", "labels": labels},
        "spec": {
            "serviceName": f"{RELEASE}-triggerer", "replicas": t["replicas"],
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec(v, t, main)},
            "volumeClaimTemplates": [{
                "metadata": {"name": "logs"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": t["persistence"]["size"]}}}}],
        },
    }


def api_server_deployment(v: dict[str, Any]) -> dict[str, Any]:
    a = v["apiServer"]
    labels = {"component": "api-server", "release": RELEASE}
    main = container("api-server", v, a, [])
    main["ports"] = [{"name": "api-server", "containerPort": 8080}]
    main["readinessProbe"] = {"httpGet": {"path": "/api/v2/monitor/health", "port": 8080,
                                          "scheme": a["readinessProbe"]["scheme"]}}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"{RELEASE}-api-server", "labels": labels},
        "spec": {"replicas": a["replicas"], "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec(v, a, main)}},
    }


def worker_statefulset(v: dict[str, Any]) -> dict[str, Any]:
    """The Celery workers: the chart's StatefulSet, with the values' ``workers.env``."""
    w = {"resources": {}, **v["workers"]}
    labels = {"component": "worker", "release": RELEASE}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": f"{RELEASE}-worker", "labels": labels},
        "spec": {"serviceName": f"{RELEASE}-worker", "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": pod_spec(v, w, container("worker", v, w, []))}},
    }


class Pod:
    """One pod of a component, its files emulated under `root`: each Secret volume it
    mounts holds the Secret's keys from secrets.yaml (the CA's from `ca`), each emptyDir
    starts empty; its init containers have run (their `localstate credential`, with the
    pod's name as its host name), and `settings` resolves its main container's."""

    def __init__(self, v: dict[str, Any], section: str, name: str, root: Path) -> None:
        self.v, self.component, self.name, self.root = v, v[section], name, root
        volumes = {vol["name"]: vol for vol in pod_spec(v, self.component, {})
                   .get("volumes", [])}
        data = {**secrets(), "airflow-api-server-tls": {
            "ca.crt": "-----BEGIN CERTIFICATE-----\n(the cluster CA)\n", "tls.crt": "",
            "tls.key": ""}}
        for vol_name, vol in volumes.items():
            folder = self.host_path(vol_name)
            folder.mkdir(parents=True, exist_ok=True)
            if "secret" in vol:
                found = data[vol["secret"]["secretName"]]
                items = vol["secret"].get("items") or [{"key": k, "path": k} for k in found]
                for item in items:
                    (folder / item["path"]).write_text(found[item["key"]])
        self.init_containers = templated(v, self.component.get("extraInitContainers", []))
        for init in self.init_containers:
            self.run_init(init)

    def host_path(self, volume: str) -> Path:
        return self.root / "volumes" / volume

    def mapped(self, text: str, volume_mounts: list[dict[str, Any]]) -> str:
        """`text` with each mount path turned into where this test keeps that volume."""
        for m in sorted(volume_mounts, key=lambda m: -len(m["mountPath"])):
            text = text.replace(m["mountPath"], str(self.host_path(m["name"])))
        return text

    def run_init(self, init: dict[str, Any]) -> None:
        command = init["args"]
        assert command[:2] == ["bash", "-c"], command
        argv = shlex.split(command[2].removeprefix("exec "))
        assert argv[:2] == ["localstate", "credential"], argv
        argv = [self.mapped(a, init["volumeMounts"]) for a in argv]
        done = subprocess.run([localstate_command(), *argv[1:], "--triggerer-id", self.name],
                              capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, "AIRFLOW_HOME": str(self.root / "home")})
        assert done.returncode == 0, done.stderr

    def environment(self) -> dict[str, str]:
        main_mounts = mounts(self.v, self.component, [])
        return {k: self.mapped(val, main_mounts) for k, val in
                environment(self.component["env"]).items()}

    def settings(self) -> Settings:
        cfg = self.root / "airflow.cfg"
        cfg.write_text("")
        return Settings.resolve(environ=self.environment(), config_file=cfg)


def environment(env: list[dict[str, Any]]) -> dict[str, str]:
    """The environment a pod gets from `env` as the chart renders it: Secret references read
    from secrets.yaml (a reference to a Secret or key it lacks fails; any other source is
    refused: the chart renders no other)."""
    data = secrets()
    out = {}
    for item in chart_env(env):
        source = item.get("valueFrom", {})
        if "value" in item:
            out[item["name"]] = item["value"]
        else:
            assert source, f"{item['name']}: rendered as {item}"
            assert "secretKeyRef" in source, f"{item['name']}: rendered as {item}"
            ref = source["secretKeyRef"]
            assert ref["name"] in data, f"{item['name']}: no Secret {ref['name']!r}"
            assert ref["key"] in data[ref["name"]], f"{item['name']}: no key {ref['key']!r}"
            out[item["name"]] = data[ref["name"]][ref["key"]]
    return out


def settings_of(env: list[dict[str, Any]], tmp_path: Path) -> Settings:
    (tmp_path / "airflow.cfg").write_text("")
    return Settings.resolve(environ=environment(env), config_file=tmp_path / "airflow.cfg")


def test_the_values_file_passes_the_charts_schema() -> None:
    """What `helm upgrade --install` checks first: the chart's values.schema.json."""
    assert schema_errors(values()) == []
    # every top-level key is one the chart knows (its schema lets unknown ones pass, and
    # the chart ignores them: a misspelt section would be dropped without a word)
    assert set(values()) <= set(chart_schema()["properties"])


@pytest.mark.parametrize(("section", "entry", "refused_at"), [
    # the pod's name from a field reference: the chart takes only these two sources
    ("triggerer", {"env": [{"name": "AIRFLOW__LOCALSTATE__TRIGGERER_ID",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
     "triggerer.env.0.valueFrom"),
    # a key the chart does not know, where its schema says additionalProperties: false
    ("triggerer", {"persistance": {"enabled": True}}, "triggerer"),
    ("apiServer", {"tokens": "x"}, "apiServer"),
])
def test_the_schema_check_refuses_what_the_chart_refuses(
    section: str, entry: dict[str, Any], refused_at: str,
) -> None:
    broken = values()
    broken[section] = {**broken[section], **entry}
    errors = schema_errors(broken)
    assert len(errors) == 1, errors
    assert errors[0].startswith(refused_at + ":"), errors


def test_the_chart_renders_a_components_env_as_mirrored_here() -> None:
    """`chart_env` is the chart's helper: the vendored helper is the text mirrored, and the
    triggerer's and API server's templates render their `env` through it."""
    helpers = (CHART / "_helpers.yaml").read_text()
    start = helpers.index('{{- define "container_extra_envs" -}}')
    assert helpers[start:start + len(EXTRA_ENVS_HELPER)] == EXTRA_ENVS_HELPER
    for template, section in (("triggerer-deployment.yaml", "triggerer"),
                              ("api-server-deployment.yaml", "apiServer")):
        text = (CHART / template).read_text()
        assert f'include "container_extra_envs" (list . .Values.{section}.env)' in text
    # a field reference would be rendered as an empty valueFrom: Kubernetes refuses the pod
    assert chart_env([{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "a"}}}]) == [
        {"name": "X", "valueFrom": None}]


def test_the_triggerers_id_is_its_pods_name_with_nothing_set() -> None:
    """The chart's triggerer StatefulSet sets no `hostname`, so each pod's host name is its
    name (airflow-triggerer-0, ...), which is localstate's default triggerer_id: stable across
    restarts of the pod, unique in the fleet."""
    template = (CHART / "triggerer-deployment.yaml").read_text()
    assert "kind: {{ if $persistence }}StatefulSet{{ else }}Deployment{{ end }}" in template
    assert not re.search(r"^\s*hostname:", template, re.M)
    assert values()["triggerer"]["persistence"]["enabled"] is True
    env = environment(values()["triggerer"]["env"])
    assert "AIRFLOW__LOCALSTATE__TRIGGERER_ID" not in env
    for n in range(values()["triggerer"]["replicas"]):
        assert default_triggerer_id(f"{RELEASE}-triggerer-{n}") == f"{RELEASE}-triggerer-{n}"


def test_the_triggerers_cache_is_on_its_own_volume() -> None:
    """The chart mounts the triggerer's volume (a volumeClaimTemplate named logs, with
    persistence on) at airflowHome/logs; the values put the cache under it."""
    template = (CHART / "triggerer-deployment.yaml").read_text()
    assert "volumeClaimTemplates:\n    - apiVersion: v1\n      kind: PersistentVolumeClaim\n" \
        "      metadata:\n        name: logs" in template
    assert '- name: logs\n              mountPath: {{ template "airflow_logs" . }}' in template
    helpers = (CHART / "_helpers.yaml").read_text()
    assert '{{- printf "%s/logs" .Values.airflowHome | quote }}' in helpers
    home = values().get("airflowHome", "/opt/airflow")
    assert f"{home}/logs" == TRIGGERER_VOLUME
    assert not values().get("logs", {}).get("persistence", {}).get("enabled", False)


@pytest.mark.parametrize("build", [triggerer_statefulset, api_server_deployment,
                                   worker_statefulset])
def test_the_workloads_of_the_values_file_are_valid_kubernetes_objects(build: Any) -> None:
    kubernetes_validate.validate(build(values()), KUBERNETES, strict=True)


def test_the_secrets_are_valid_kubernetes_objects() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "secrets.yaml").read_text()) if d]
    assert [d["kind"] for d in docs] == ["Secret", "Secret", "Secret"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_an_invalid_object_fails_the_validation() -> None:
    """The check above can fail: a misspelt field is refused."""
    broken = triggerer_statefulset(values())
    broken["spec"]["template"]["spec"]["containers"][0]["envv"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_each_triggerer_reaches_state_over_https_with_its_own_credential(
    tmp_path: Path,
) -> None:
    """Two pods of the triggerers' StatefulSet, their init containers run: each resolves
    sink = api over https with the cluster's CA and the credential made for its own name
    (through AIRFLOW__LOCALSTATE__API_TOKEN_CMD); the API server takes each as that
    triggerer only, read-write, for the owners the triggers use."""
    v = values()
    server = Pod(v, "apiServer", f"{RELEASE}-api-server-0", tmp_path / "api").settings()
    authorizer = Authorizer(server.api_tokens)
    credentials = set()
    for n in range(v["triggerer"]["replicas"]):
        name = f"{RELEASE}-triggerer-{n}"
        pod = Pod(v, "triggerer", name, tmp_path / name)
        s = pod.settings()
        assert s.sink == "api"
        assert s.api_url == f"https://{RELEASE}-api-server:8080/localstate"
        assert s.sources["api_token"] == ("environment AIRFLOW__LOCALSTATE__API_TOKEN_CMD "
                                          "(command)")
        assert s.api_ca_bundle is not None
        assert s.api_ca_bundle.read_text().startswith("-----BEGIN CERTIFICATE-----")
        assert s.triggerer_id is None  # the host name: the pod's name
        assert s.resolved_cache_dir.is_relative_to(TRIGGERER_VOLUME)
        assert s.statsd_host == f"{RELEASE}-statsd"
        assert s.api_token == derive(secrets()["localstate-triggerer-key"]["key"], name)
        caller = authorizer.authenticate(f"Bearer {s.api_token}")
        assert (caller.identity, caller.bound, caller.can_write) == (name, True, True)
        assert caller.may_read("asset_watcher:orders")
        assert not caller.may_read("dag:etl/load")
        credentials.add(s.api_token)
    assert len(credentials) == v["triggerer"]["replicas"]


def test_the_tasks_reach_state_through_their_dags_connection(tmp_path: Path) -> None:
    """The workers' `localstate` connection points at the API server's service over https,
    with the cluster's CA and a token the API server takes, read-write and limited to one
    DAG's owners and the watcher it reads: the docs' task (`dag:etl/load`) may write, a
    triggerer's owners and another DAG's are refused."""
    from localstate._core.api_connection import endpoint
    from localstate.airflow.hook import LocalStateHook

    v = values()
    env = environment(v["workers"]["env"])
    conn = json.loads(env["AIRFLOW_CONN_LOCALSTATE_DEFAULT"])
    assert conn["conn_type"] == "localstate"
    found = endpoint("localstate_default", conn["host"], password=conn["password"],
                     extra=conn["extra"])
    assert found.url == f"https://{RELEASE}-api-server:8080/localstate"
    assert found.ca_bundle is not None
    assert any(found.ca_bundle.startswith(m["mountPath"] + "/")
               for m in v["volumeMounts"])  # the CA every Airflow container mounts
    server = settings_of(v["apiServer"]["env"], tmp_path)
    [token] = [t for t in server.api_tokens if t.secret == conn["password"]]
    assert token.role == "read-write"
    assert token.allows(LocalStateHook.task_owner("etl", "load"))
    assert token.allows("asset_watcher:orders")
    for other in ("dag:etl_backfill/load", "dag:reports/load", "trigger:x", "asset_watcher:x"):
        assert not token.allows(other), other
    assert not any(k.startswith("AIRFLOW__LOCALSTATE__") for k in env)  # no sink, no token


def test_keys_and_tokens_are_only_in_the_component_that_uses_them() -> None:
    """The API server's tokens in its pods only; the triggerers' key in their init
    container only (its volume is mounted nowhere else: not in the triggerer's container,
    not in the chart's own init container or log groomer, which get extraVolumeMounts);
    the tasks' connection in the workers only; nothing of localstate in what the chart
    shares between components but the CA certificate."""
    v = values()
    text_of = {section: json.dumps(v.get(section)) for section in v}
    for secret, component in (("localstate-api-tokens", "apiServer"),
                              ("localstate-triggerer-key", "triggerer"),
                              ("localstate-task-connection", "workers")):
        holders = [section for section, text in text_of.items() if secret in text]
        assert holders == [component], (secret, holders)
    [key_volume] = [vol["name"] for vol in v["triggerer"]["extraVolumes"]
                    if vol.get("secret", {}).get("secretName") == "localstate-triggerer-key"]
    holders = [c["name"] for c in v["triggerer"]["extraInitContainers"]
               if any(m["name"] == key_volume for m in c["volumeMounts"])]
    assert holders == ["localstate-credential"]
    assert key_volume not in json.dumps(v["triggerer"]["extraVolumeMounts"])
    assert key_volume not in json.dumps(v.get("volumeMounts", []))
    # the certificate's Secret: its key only in the API server; elsewhere its CA alone
    [shared] = [vol for vol in v["volumes"] if "secret" in vol]
    assert shared["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    for data in secrets().values():
        for value in data.values():
            for token in re.findall(r"REPLACE-[\w-]+", value):
                assert token not in (DEPLOY / "values.yaml").read_text()
    assert "localstate" not in json.dumps(v.get("config", {})).lower()


def test_the_statsd_mapping_is_the_one_the_metrics_page_documents() -> None:
    page = (ROOT / "docs" / "operations" / "metrics.md").read_text()
    documented = yaml.safe_load(page.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert values()["statsd"]["extraMappings"] == documented["mappings"]


def test_the_image_is_the_airflow_the_values_name_and_localstate_supports() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    found = re.search(r"^ARG AIRFLOW_IMAGE=apache/airflow:(\d+\.\d+\.\d+)-python", dockerfile,
                      re.M)
    assert found is not None
    version = found[1]
    v = values()
    assert v["airflowVersion"] == v["defaultAirflowTag"] == version
    assert v["images"]["airflow"]["tag"].startswith(version)
    pyproject = (ROOT / "pyproject.toml").read_text()
    pin = re.search(r'"apache-airflow>=(\d+\.\d+),<(\d+\.\d+)"', pyproject)
    assert pin is not None
    as_tuple = tuple(int(p) for p in version.split(".")[:2])
    assert tuple(map(int, pin[1].split("."))) <= as_tuple < tuple(map(int, pin[2].split(".")))
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in dockerfile  # Airflow stays as it is
    # what the components need: the plugin (airflow, api), the triggerers' API sink (client),
    # the central DB's driver (postgres)
    extras = re.search(r'"\$\{wheel\}\[([a-z,]+)\]"', dockerfile)
    assert extras is not None
    assert set(extras[1].split(",")) == {"airflow", "api", "client", "postgres"}


def in_context(path: str, ignore: str) -> bool:
    """Whether `docker build .` sends the file `path` under the .dockerignore `ignore` (its
    patterns as Docker reads them: the last that matches the path or a folder of it
    decides, ! admits)."""
    sent = True
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    for line in (raw.strip() for raw in ignore.splitlines()):
        if not line or line.startswith("#"):
            continue
        admit, pattern = line.startswith("!"), line.removeprefix("!")
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            sent = admit
    return sent


def test_the_image_installs_one_named_wheel_with_airflows_constraints() -> None:
    """One wheel, named by a build argument (no glob that two wheels would break); Airflow's
    constraints for the image's Airflow and Python; the build context holds only the wheels
    and the constraints file (never a .venv, caches or local state)."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    found = re.search(r"^ARG AIRFLOW_IMAGE=apache/airflow:(\d+\.\d+\.\d+)-python(\d+\.\d+)",
                      dockerfile, re.M)
    assert found is not None
    airflow, python = found[1], found[2]
    assert f"ARG AIRFLOW_CONSTRAINTS=https://raw.githubusercontent.com/apache/airflow/" \
        f"constraints-{airflow}/constraints-{python}.txt" in dockerfile
    assert '--constraint "${AIRFLOW_CONSTRAINTS}"' in dockerfile
    assert "*" not in "".join(re.findall(r"^COPY .*$", dockerfile, re.M))
    [copy] = re.findall(r"^COPY --chown=airflow:root (.*) /tmp/localstate-build/$", dockerfile,
                        re.M)
    wheel_arg, constraints = copy.split()
    assert wheel_arg == "${LOCALSTATE_WHEEL}"
    pins = (ROOT / constraints).read_text()
    assert f"\napache-airflow=={airflow}\n" in pins
    assert f"on Python {python}" in pins.splitlines()[0]
    ignore = (ROOT / ".dockerignore").read_text()
    assert in_context(constraints, ignore)
    assert in_context("dist/localstate-1.0.0-py3-none-any.whl", ignore)
    for kept_out in (".venv/bin/python", ".git/config", "localstate/__init__.py",
                     "dist/localstate-1.0.0.tar.gz", "airflow.cfg", "cache/t.db",
                     "tests/data/airflow-chart-1.21.0/values.yaml.gz", "deploy/kubernetes/x"):
        assert not in_context(kept_out, ignore), kept_out


# -- the hardening page's checklist, over the example ------------------------------------------

HARDENING = ROOT / "docs" / "operations" / "hardening.md"


class Example:
    """The example deployment as its pods see it: two triggerers (init containers run), an
    API server, a worker's connection; their settings resolved."""

    def __init__(self, root: Path) -> None:
        self.v = values()
        self.root = root
        self.server = Pod(self.v, "apiServer", f"{RELEASE}-api-server-0",
                          root / "api").settings()
        self.triggerers = {
            name: Pod(self.v, "triggerer", name, root / name).settings()
            for name in (f"{RELEASE}-triggerer-{n}"
                         for n in range(self.v["triggerer"]["replicas"]))}
        self.connection = json.loads(
            environment(self.v["workers"]["env"])["AIRFLOW_CONN_LOCALSTATE_DEFAULT"])

    def tokens(self) -> list[Any]:
        return list(self.server.api_tokens)


def _random_bits(e: Example) -> None:
    text = (DEPLOY / "secrets.yaml").read_text()
    assert "secrets.token_urlsafe(32)" in text  # the page's generator, named where they go
    for t in e.tokens():  # placeholders to replace, none usable as it stands
        assert t.secret.startswith("REPLACE-"), t.name


def _own_credential(e: Example) -> None:
    authorizer = Authorizer(e.server.api_tokens)
    for name, s in e.triggerers.items():
        caller = authorizer.authenticate(f"Bearer {s.api_token}")
        assert (caller.identity, caller.bound) == (name, True)
    assert len({s.api_token for s in e.triggerers.values()}) == len(e.triggerers)
    # the key is mounted in the init container only (test_keys_and_tokens_... checks where)
    assert all(t.per_triggerer for t in e.tokens() if "trigger:" in t.owners and t.can_write)


def _dag_tokens(e: Example) -> None:
    dag_tokens = [t for t in e.tokens() if any(o.startswith("dag:") for o in t.owners)
                  and t.can_write]
    assert dag_tokens
    for t in dag_tokens:
        for owner in t.owners:
            assert re.fullmatch(r"dag:[^/]+/|asset_watcher:.+", owner), (t.name, owner)


def _read_tokens(e: Example) -> None:
    [dashboards] = [t for t in e.tokens() if t.name == "dashboards"]
    assert dashboards.role == "read"


def _no_star(e: Example) -> None:
    assert all("" not in t.owners for t in e.tokens())


def _from_a_secret(e: Example) -> None:
    for section in ("apiServer", "triggerer", "workers"):
        for item in e.v[section]["env"]:
            if item["name"] in ("AIRFLOW__LOCALSTATE__API_TOKEN",
                                "AIRFLOW__LOCALSTATE__API_TOKENS",
                                "AIRFLOW_CONN_LOCALSTATE_DEFAULT"):
                assert "secretKeyRef" in item["valueFrom"], item
    assert e.server.sources["api_tokens"].startswith("environment ")
    for s in e.triggerers.values():
        assert s.sources["api_token"].endswith("_CMD (command)")
    assert "localstate" not in json.dumps(e.v.get("config", {}))


def _password_field(e: Example) -> None:
    assert e.connection["password"].startswith("REPLACE-")
    assert e.connection["password"] not in json.dumps(
        {k: v for k, v in e.connection.items() if k != "password"})


def _https(e: Example) -> None:
    for s in e.triggerers.values():
        assert s.api_url is not None
        assert s.api_url.startswith("https://")
        assert s.api_ca_bundle is not None
    assert e.connection["host"].startswith("https://")
    assert e.connection["extra"]["ca_bundle"]
    assert e.v["config"]["core"]["execution_api_server_url"].startswith("https://")


def _api_open(e: Example) -> None:
    assert e.server.api_open is False


def _trusted_origins(e: Example) -> None:
    assert e.server.api_trusted_origins == ()


def _fleet_details(e: Example) -> None:
    assert e.server.api_fleet_details is False


def _request_bounds(e: Example) -> None:
    # the defaults: the largest flush a triggerer sends (its max_batch) and no more
    assert e.server.sources["api_max_request_bytes"] == "default"
    assert e.server.sources["api_max_batch_rows"] == "default"
    assert all(s.max_batch <= e.server.api_max_batch_rows for s in e.triggerers.values())


def _no_serve(e: Example) -> None:
    assert "localstate serve" not in (DEPLOY / "values.yaml").read_text()


def _local_disk(e: Example) -> None:
    # a ReadWriteOnce claim of the cluster's default storage class: a block volume, not NFS
    [claim] = triggerer_statefulset(e.v)["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in e.v["triggerer"]["persistence"]


def _private_cache(e: Example) -> None:
    """A triggerer's cache opened where its settings put it (the volume under this test's
    folder, with the usual umask): the folder 0700, the files 0600."""
    from localstate._cache.local_cache import LocalCache

    name, s = next(iter(e.triggerers.items()))
    volume = e.root / "triggerer-volume"
    path = Path(str(s.resolved_cache_path).replace(TRIGGERER_VOLUME, str(volume)))
    old = os.umask(0o022)
    try:
        cache = asyncio.run(LocalCache.open(path, owner_id=name))
        asyncio.run(cache.close())
    finally:
        os.umask(old)
    assert oct(path.parent.stat().st_mode & 0o777) == oct(0o700)
    for f in path.parent.iterdir():
        assert oct(f.stat().st_mode & 0o777) == oct(0o600), f


def _persistent_and_stable(e: Example) -> None:
    assert e.v["triggerer"]["persistence"]["enabled"] is True
    for s in e.triggerers.values():
        assert s.triggerer_id is None  # the host name: the StatefulSet pod's name
        assert s.resolved_cache_dir.is_relative_to(TRIGGERER_VOLUME)


def _local_sync(e: Example) -> None:
    assert all(s.local_sync == "full" for s in e.triggerers.values())


def _airflows_user(e: Example) -> None:
    assert e.server.central_url is None  # Airflow's sql_alchemy_conn, its user
    assert "CENTRAL_URL" not in (DEPLOY / "values.yaml").read_text()


def _upgrade_schema(e: Example) -> None:
    assert e.server.upgrade_schema is False


def _statsd(e: Example) -> None:
    assert e.v["statsd"]["enabled"] is True
    assert all(s.statsd_host == f"{RELEASE}-statsd" for s in e.triggerers.values())


#: each line of the checklist (by its opening words): its check over the example, or why it
#: is not a property of the example's files
CHECKLIST: dict[str, Any] = {
    "Every token has 256 random bits": _random_bits,
    "Each triggerer has its own credential": _own_credential,
    "Each DAG that keeps state has its own token": _dag_tokens,
    "Dashboards and read-only tools get `read` tokens": _read_tokens,
    "No token has the `*` prefix": _no_star,
    "Tokens come from a secret": _from_a_secret,
    "Connections of type `localstate` keep the token in the password field": _password_field,
    "`api_url` and the connections' hosts use `https://`": _https,
    "`api_open` stays `false`": _api_open,
    "`api_trusted_origins` lists only": _trusted_origins,
    "`api_fleet_details` stays `false`": _fleet_details,
    "`api_max_request_bytes` and `api_max_batch_rows` fit": _request_bounds,
    "`localstate serve`, if you run it": _no_serve,
    "`cache_dir` is on a local disk": _local_disk,
    "`cache_dir` is readable and writable by the Airflow user only": _private_cache,
    "In containers, `cache_dir` is on a persistent volume": _persistent_and_stable,
    "`local_sync` stays `full`": _local_sync,
    "localstate uses Airflow's own database user": _airflows_user,
    "`upgrade_schema = False` in production": _upgrade_schema,
    "The metadata DB's backups include": "the operator's backups, not the example's files",
    "The `localstate.api.audit` logger goes to your log store": "the cluster's log shipping",
    "Metrics go to StatsD or OpenTelemetry": _statsd,
    "`localstate status --fleet` is in your runbook": "a runbook, not the example's files",
}


def test_the_hardening_checklist_holds_for_the_example(tmp_path: Path) -> None:
    """Every line of the hardening page's checklist has its check here (or the reason it is
    not a property of deploy/kubernetes/), and each check holds for the example."""
    checklist = HARDENING.read_text().split("## Rotating", 1)[0]
    lines = [line[2:] for line in checklist.splitlines() if line.startswith("- ")]
    matched = {line: [k for k in CHECKLIST if line.startswith(k)] for line in lines}
    assert all(len(m) == 1 for m in matched.values()), matched
    assert sorted(k for m in matched.values() for k in m) == sorted(CHECKLIST)
    example = Example(tmp_path)
    for check in CHECKLIST.values():
        if callable(check):
            check(example)
