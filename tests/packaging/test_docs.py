"""The documentation site and the README: they build, they are complete, and their code works.

* `mkdocs build --strict` passes (broken links, missing pages, bad snippets and docstrings
  fail it), with the reference pages generated from the code by ``docs/hooks/reference.py``;
* every module of ``localstate/`` and ``sync/`` appears in the architecture page, every typed
  error in the troubleshooting page, every setting, command and route in the references;
* every code block of the user docs is run (Python, ``python -c``), checked by the parser that
  will read it (airflow.cfg blocks by localstate's setting parsers and Airflow's own config,
  commands by the ``localstate`` and ``airflow`` argument parsers, JSON by a JSON parser), or
  included from a tested file; the ``pip install`` lines are run by
  tests/packaging/test_docs_install.py;
* what the docs say matches the code and each other: the REST statuses, the troubleshooting
  statuses, the tokens' owner prefixes, the README's benchmark figures, one host name for the
  API server, one name for a stalled triggerer; their sentences stay short;
* the user docs name no issue numbers, internal notes, test files or "this machine".
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MKDOCS = Path(sys.executable).parent / "mkdocs"
#: the user docs: the site's pages and the README (docs/research/ is an internal note)
USER_PAGES = sorted(p for p in DOCS.rglob("*.md") if "research" not in p.relative_to(DOCS).parts)

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook",
                                                  DOCS / "hooks" / "reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _blocks(*pages: Path) -> Iterator[tuple[Path, str, str]]:
    for page in pages:
        for lang, body in FENCE.findall(page.read_text()):
            yield page, lang, body


def _generated_pages() -> dict[str, str]:
    hooks = _hooks()
    pages = {uri: make() for uri, make in hooks.PAGES.items()}
    pages["benchmarks.md"] = hooks.benchmarks_page(DOCS)
    return pages


# -- the build ------------------------------------------------------------------------------


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    for page in ("index.html", "deploy/index.html", "reference/configuration/index.html",
                 "reference/cli/index.html", "reference/rest-api/index.html",
                 "reference/python-api/index.html", "reference/metrics/index.html",
                 "operations/troubleshooting/index.html", "benchmarks/index.html",
                 "architecture/index.html", "changelog/index.html"):
        assert (site / page).is_file(), page
    # the internal note and the generator are not published
    assert not (site / "research").exists()
    assert not (site / "hooks").exists()
    # mkdocstrings rendered the store's calls, and the snippet the example trigger
    api = (site / "reference/python-api/index.html").read_text()
    assert "compare_and_set" in api
    assert "BlockingStateStore" in api
    assert "get_watermark" in api  # members without a docstring are listed too
    triggers = (site / "guides/triggers/index.html").read_text()
    assert "NewRowsTrigger" in triggers
    assert "ack_delay" in triggers
    events = (site / "guides/exactly-once-events/index.html").read_text()
    assert "NewRowsEventsTrigger" in events


# -- completeness -----------------------------------------------------------------------------


def test_the_architecture_page_maps_every_module_by_folder() -> None:
    """The module map is built from the code: every module of localstate/ and sync/ under its
    folder's heading, with the first sentence of its docstring; the page holds its place."""
    page = (DOCS / "architecture.md").read_text()
    hooks = _hooks()
    assert hooks.MODULE_MAP in page
    built = hooks.module_map(ROOT)
    modules = [p.relative_to(ROOT).as_posix()
               for base in (ROOT / "localstate", ROOT / "sync") for p in base.rglob("*.py")]
    assert len(modules) > 100
    assert [m for m in modules if f"| `{m}` | " not in built] == []
    rows = [line for line in built.splitlines() if line.startswith("| `")]
    assert len(rows) == len(modules)
    assert "| `sync/flush/worker.py` | `SyncWorker`: moves" in built
    headings = [line for line in built.splitlines() if line.startswith("### ")]
    # the folders, lowest layer first: the foundation before the local cache, the central DB,
    # the flush and the store
    order = [next(i for i, h in enumerate(headings) if f"`{folder}/`" in h) for folder in (
        "localstate/_core", "localstate/_cache", "sync/central", "sync/sinks", "sync/flush",
        "localstate")]
    assert order == sorted(order)


def test_troubleshooting_lists_every_typed_error() -> None:
    import localstate.errors as errors

    page = _hooks().troubleshooting_page()
    classes = [name for name in errors.__all__
               if isinstance(getattr(errors, name), type)]
    assert len(classes) >= 19
    for name in classes:
        assert f"\n## {name}\n" in page, name


def test_the_configuration_reference_has_every_setting() -> None:
    from localstate._core.setting_specs import SPECS

    page = _hooks().configuration_page()
    for name, spec in SPECS.items():
        assert f"`{name}`" in page
        assert f"`AIRFLOW__LOCALSTATE__{name.upper()}`" in page
        assert spec.help.split(";")[0][:40] in page.replace("\\|", "|")


def test_the_cli_reference_has_every_command() -> None:
    page = _hooks().cli_page()
    for command in ("get", "set", "delete", "ls", "status", "flush", "serve", "bench",
                    "db upgrade", "db prune", "config"):
        assert f"## `localstate {command}`" in page or f"# `localstate {command}`" in page
    assert "--expected-version" in page
    assert "--older-than" in page


def test_the_rest_reference_has_every_route() -> None:
    hooks = _hooks()
    doc = hooks._openapi()
    page = hooks.rest_page()
    assert doc["openapi"].startswith("3.")
    for path, methods in doc["paths"].items():
        for method in methods:
            assert f"## `{method.upper()} {path}`" in page
    assert "/api/v1/fleet" in doc["paths"]
    assert "/api/v1/flush" in doc["paths"]


def test_the_metrics_reference_has_every_metric() -> None:
    from localstate._metrics import COUNTERS, GAUGES, OWNER_LAG, PRUNE_COUNTERS, TIMER

    page = _hooks().metrics_page()
    for name in (*COUNTERS.values(), *GAUGES.values(), TIMER, *PRUNE_COUNTERS, OWNER_LAG):
        assert f"`localstate.{name}`" in page


def test_benchmarks_are_rendered_from_every_json_in_docs() -> None:
    page = _hooks().benchmarks_page(DOCS)
    for data in DOCS.glob("*.json"):
        assert data.name.removesuffix(".json") in page or data.name in page, data.name
    # dated and with ratios
    assert re.search(r"\.json`, \d{4}-\d{2}-\d{2};", page)
    assert "× direct" in page
    assert "× raw" in page


# -- the rules for user docs -------------------------------------------------------------------

#: what user docs never say: issue numbers, internal notes, the machine the project was built
#: on, other sessions, and test files or names given as proof
FORBIDDEN = {
    "an issue number": re.compile(r"(?<![\w&])#\d+\b|\bissues? \d+"),
    "'this machine'": re.compile(r"this (2-core )?machine", re.I),
    "'other agents'": re.compile(r"other agents|other helpers|other sessions", re.I),
    "a load average": re.compile(r"load average", re.I),
    "a test file or test name": re.compile(r"tests/\S+\.py|\btest_\w+"),
    "an internal note": re.compile(r"docs/research|internal note|\bTODO\b|\bFIXME\b", re.I),
}


def _user_texts() -> Iterator[tuple[str, str]]:
    for page in USER_PAGES:
        yield page.relative_to(ROOT).as_posix(), page.read_text()
    yield "README.md", README.read_text()
    yield "CHANGELOG.md", (ROOT / "CHANGELOG.md").read_text()
    for uri, text in _generated_pages().items():
        yield f"(generated) {uri}", text


def test_user_docs_name_no_internal_material() -> None:
    found = []
    for name, text in _user_texts():
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(text):
                found.append(f"{name}: {what}: {match.group(0)!r}")
    assert not found, "\n".join(found)


def test_the_forbidden_patterns_catch_what_they_name() -> None:
    samples = {"an issue number": "fixed in #20", "'this machine'": "on this machine",
               "'other agents'": "while other agents loaded it",
               "a load average": "at a load average of 3",
               "a test file or test name": "checked by tests/faults/test_soak.py",
               "an internal note": "see docs/research/notes.md"}
    for what, text in samples.items():
        assert FORBIDDEN[what].search(text), what
    assert not FORBIDDEN["an issue number"].search("the [install](deploy.md#1-install) step")


def test_the_readme_is_short_and_keeps_its_quick_start() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert ("python3 -m venv .venv && .venv/bin/pip install -q -e . && "
            ".venv/bin/localstate bench --quick") in text
    assert "\n./scripts/test\n" in text
    # every relative link resolves
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), target


def test_the_readme_trigger_is_taken_from_the_tested_example() -> None:
    """The README's Python is an excerpt, in order, of the example trigger the end-to-end tests
    run in real Airflow processes (the README cannot include a file)."""
    blocks = [body for _, lang, body in _blocks(README) if lang == "python"]
    assert len(blocks) == 1
    source = (ROOT / "localstate/examples/new_rows_events_trigger.py").read_text().splitlines()
    lines = [line for line in blocks[0].splitlines() if line.strip()]
    assert len(lines) >= 15
    at = 0
    for line in lines:
        while at < len(source) and source[at] != line:
            at += 1
        assert at < len(source), f"not in the example, or out of order: {line!r}"
        at += 1


# -- every code block ----------------------------------------------------------------------

LANGS = {"python", "ini", "sh", "json", "text", "yaml"}


def test_every_code_block_has_a_checked_language() -> None:
    for page, lang, _ in _blocks(*USER_PAGES, README):
        assert lang in LANGS, f"{page.relative_to(ROOT)}: a ```{lang} block: nothing checks it"


def test_yaml_blocks_parse() -> None:
    """Each YAML block is valid YAML (what each says is checked where it is used: the
    statsd_exporter mapping by the metrics tests, Kubernetes values by the deployment's)."""
    import yaml

    checked = 0
    for page, lang, body in _blocks(*USER_PAGES):
        if lang == "yaml":
            assert yaml.safe_load(body) is not None, page.relative_to(ROOT)
            checked += 1
    assert checked >= 1


def _snippet_paths(body: str) -> list[str]:
    return re.findall(r'^--8<-- "([^"]+)"$', body, re.M)


def test_python_blocks_run(tmp_path: Path) -> None:
    ran = 0
    for page, lang, body in _blocks(*USER_PAGES):
        if lang != "python":
            continue
        snippets = _snippet_paths(body)
        if snippets:  # included from a file the end-to-end tests run
            assert all(s.startswith(("localstate/examples/", "tests/")) for s in snippets)
            assert all((ROOT / s).is_file() for s in snippets)
            continue
        work = tmp_path / f"block{ran}"
        work.mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW__", "LOCALSTATE_"))}
        env["AIRFLOW_HOME"] = str(work / "airflow-home")
        proc = subprocess.run([sys.executable, "-c", body], cwd=work, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{page.relative_to(ROOT)}:\n{body}\n{proc.stderr[-3000:]}"
        ran += 1
    assert ran >= 2


def test_ini_blocks_are_settings_localstate_and_airflow_accept(tmp_path: Path) -> None:
    from localstate._core.config import Settings

    airflow_options: list[tuple[str, str]] = []
    checked = 0
    for page, lang, body in _blocks(*USER_PAGES, README):
        if lang != "ini":
            continue
        cfg = configparser.ConfigParser(inline_comment_prefixes=None,
                                        comment_prefixes=(";", "#"), interpolation=None)
        cfg.read_string(body)
        for section in cfg.sections():
            if section != "localstate":
                airflow_options += [(section, option) for option in cfg[section]]
        if cfg.has_section("localstate"):
            path = tmp_path / f"airflow{checked}.cfg"
            path.write_text(body)
            settings = Settings.resolve(environ={}, config_file=path)
            for option in cfg["localstate"]:
                assert settings.sources[option] != "default", (page, option)
        checked += 1
    assert checked >= 6
    # the other sections' options are Airflow's own
    script = ("import json, sys\nfrom airflow.configuration import conf\n"
              "print(json.dumps([o for o in json.loads(sys.argv[1]) "
              "if not conf.has_option(o[0], o[1])]))")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")},
           "AIRFLOW_HOME": str(tmp_path / "airflow-home")}
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(airflow_options)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_json_blocks_parse() -> None:
    for _page, lang, body in _blocks(*USER_PAGES):
        if lang == "json":
            json.loads(body)


def _commands(*pages: Path) -> Iterator[tuple[Path, list[str]]]:
    for page, lang, body in _blocks(*pages):
        if lang != "sh":
            continue
        for line in body.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            for part in line.split("&&"):
                yield page, shlex.split(part, comments=True)


def _check_deployment_command(argv: list[str], where: str) -> None:
    """The Kubernetes page's commands: the files each names exist, the image built and
    pushed is the one the values file runs, from the one wheel a build argument names, and
    the chart is the pinned version of Airflow's repository (what the values say is checked
    by tests/packaging/test_kubernetes.py)."""
    import yaml

    values = yaml.safe_load((ROOT / "deploy/kubernetes/values.yaml").read_text())
    image = f"{values['images']['airflow']['repository']}:{values['images']['airflow']['tag']}"
    pinned = re.search(r"--version (\d+\.\d+\.\d+)",
                       (ROOT / "deploy/kubernetes/values.yaml").read_text())
    assert pinned is not None
    files = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-f"]
    assert all((ROOT / f).is_file() for f in files), where
    if argv[:2] == ["docker", "build"]:
        assert files == ["deploy/kubernetes/Dockerfile"], where
        assert argv[-1] == ".", where
        assert argv[argv.index("-t") + 1] == image, where
        assert argv[argv.index("--build-arg") + 1] == (
            "LOCALSTATE_WHEEL=$(ls dist/localstate-*-py3-none-any.whl)"), where
    elif argv[:2] == ["docker", "push"]:
        assert argv[2:] == [image], where
    elif argv[:2] == ["kubectl", "apply"]:
        assert files == ["deploy/kubernetes/secrets.yaml"], where
    elif argv[:3] == ["kubectl", "create", "namespace"]:
        assert argv[3:] == ["airflow"], where
    elif argv[:4] == ["kubectl", "create", "secret", "generic"]:
        # the API server's certificate, with the keys the values file mounts
        assert argv[4] == "airflow-api-server-tls", where
        keys = sorted(a.split("=")[1] for a in argv if a.startswith("--from-file="))
        assert keys == ["ca.crt", "tls.crt", "tls.key"], where
    elif argv[:3] == ["helm", "repo", "add"]:
        assert argv[3:] == ["apache-airflow", "https://airflow.apache.org"], where
    elif argv[:3] == ["helm", "repo", "update"]:
        assert argv[3:] == ["apache-airflow"], where
    else:
        assert argv[0] == "helm", where
        install = argv[1:3] == ["upgrade", "--install"]
        assert install or argv[1] == "template", where
        rest = argv[3:] if install else argv[2:]
        assert rest[:2] == ["airflow", "apache-airflow/airflow"], where
        assert rest[rest.index("--version") + 1] == pinned[1], where
        assert files == ["deploy/kubernetes/values.yaml"], where


def test_shell_commands_are_ones_the_tools_accept(tmp_path: Path) -> None:
    """Each command line of a ```sh block is run (``python -c``) or parsed by the program that
    will read it; a command no rule knows fails the test."""
    from localstate._core.config import Settings
    from localstate.api import create_app
    from localstate.cli import build_parser

    installed = metadata.metadata("localstate")
    extras = set(installed.get_all("Provides-Extra") or ())
    wheel = f"dist/localstate-{installed['Version']}-py3-none-any.whl"
    routes = set(create_app(Settings.resolve({"central_url": "sqlite:////never/opened.db"}))
                 .openapi()["paths"])
    airflow_commands: list[list[str]] = []
    seen: set[str] = set()
    pip_extras: set[str] = set()  # what the last `pip install` of the page installed
    for page, argv in _commands(*USER_PAGES, README):
        where = f"{page.relative_to(ROOT)}: {shlex.join(argv)}"
        if argv[0] == "export":
            argv = argv[1:]
        program = argv[0]
        seen.add(program.split("=", 1)[0])
        if re.fullmatch(r"AIRFLOW_CONN_[A-Z0-9_]+=.+", program, re.S):
            # a connection as Airflow reads it from the environment: a localstate one
            assert len(argv) == 1, where
            value = program.split("=", 1)[1]
            conn = (json.loads(value) if value.startswith("{")
                    else {"conn_type": value.split("://", 1)[0], "host": value})
            assert conn["conn_type"] == "localstate", where
            assert conn["host"].startswith(("http://", "https://", "localstate://")), where
            continue
        if program == "mkdocs":
            # the reference pages are generated from the code, the REST one from the API's
            # app: a docs build needs the api extra beside the docs one
            assert argv[1:] in (["serve"], ["build", "--strict"]), where
            assert {"docs", "api"} <= pip_extras, f"{where}: after pip install {pip_extras}"
            continue
        if program == "localstate":
            build_parser().parse_args(argv[1:])  # SystemExit(2) on a bad command line
        elif program == "airflow":
            airflow_commands.append(argv[1:])
        elif len(argv) == 3 and argv[:2] == ["python", "-c"]:
            proc = subprocess.run([sys.executable, "-c", argv[2]], capture_output=True,
                                  text=True, timeout=60)
            assert proc.returncode == 0, where
            assert proc.stdout.strip(), where
        elif argv in (["python", "-m", "build"], ["python", "-m", "build", "--wheel"],
                      ["python", "-m", "pip", "install", "build"], ["rm", "-rf", "dist"]):
            pass  # tests/packaging/test_wheel.py runs the build
        elif program == "pip" and argv[1] == "install":
            # the form; tests/packaging/test_docs_install.py runs each install
            target, *options = argv[2:]
            m = re.fullmatch(r"(\.|[\w./-]+\.whl)\[([\w,]+)\]", target)
            assert m, where
            assert m.group(1) in (".", wheel), where
            pip_extras = set(m.group(2).split(","))
            assert pip_extras <= extras, where
            assert options in ([], ["--constraint", "constraints-3.11.txt"]), where
        elif program == "sqlite3":
            # the backup page's online backup and its check, run by tests/unit/test_cache_backup.py
            assert page == DOCS / "operations" / "backup.md", where
            assert argv[2].startswith(".backup '") or argv[2] == "PRAGMA integrity_check", where
        elif program == "curl":
            url = argv[-1]
            path = re.sub(r"^https?://[^/]+(/localstate)?", "", url)
            assert path in routes, where
        elif program in ("docker", "kubectl", "helm"):
            _check_deployment_command(argv, where)
        elif program in ("python3", "./scripts/test", ".venv/bin/pip", ".venv/bin/localstate"):
            # the README's quick start, run by tests/airflow/test_cli_bench.py and by CI as written
            assert page == README, where
        else:
            pytest.fail(f"{where}: no rule checks this command")
    assert {"localstate", "airflow", "pip", "curl"} <= seen
    script = ("import json, sys\nfrom airflow.cli.cli_parser import get_parser\n"
              "for argv in json.loads(sys.argv[1]):\n    get_parser().parse_args(argv)\n"
              "print('ok')")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")},
           "AIRFLOW_HOME": str(tmp_path / "airflow-home")}
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(airflow_commands)],
                          capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


# -- what the docs say matches the code ----------------------------------------------------


def test_the_rest_reference_lists_what_each_route_declares_and_raises() -> None:
    """Each route declares every status it raises itself (`ApiError(NNN, ...)` in its body),
    every route behind a token declares 401 and 403, and the generated page lists what the
    route declares, under the route."""
    import inspect

    from fastapi.routing import APIRoute

    from localstate._core.config import Settings
    from localstate.api import create_app

    app = create_app(Settings.resolve({"central_url": "sqlite:////never/opened.db"}))
    page = _hooks().rest_page()
    checked = 0
    for route in app.routes:
        if not isinstance(route, APIRoute) or not route.path.startswith("/api/v1/"):
            continue
        declared = {int(code) for code in route.responses} | {route.status_code or 200}
        raised = {int(n) for n in re.findall(r"ApiError\((\d{3})",
                                              inspect.getsource(route.endpoint))}
        assert raised <= declared, (route.path, raised - declared)
        if route.path != "/api/v1/health":
            assert {401, 403, 422, 503} <= declared, (route.path, declared)
        for method in route.methods:
            heading = f"## `{method} {route.path_format}`"
            section = page.split(heading, 1)[1].split("\n## ", 1)[0]
            listed = {int(n) for n in re.findall(r"^\| (\d{3}) \|", section, re.M)}
            assert listed == declared, (method, route.path, listed, declared)
            checked += 1
    assert checked >= 12
    flush = page.split("## `POST /api/v1/flush`", 1)[1].split("\n## ", 1)[0]
    assert "too_many_rows" in flush


def test_the_troubleshooting_statuses_are_the_apis() -> None:
    from localstate._core.protocol import answer_for
    from localstate.errors import CentralError, CentralUnavailable, ValueTooLarge

    page = _hooks().troubleshooting_page()
    for error in (CentralError("x"), CentralUnavailable("x"),
                  ValueTooLarge("x", size=2, limit=1)):
        row = re.search(rf"^\| \[`{type(error).__name__}`\].*\| (\S+) \|$", page, re.M)
        assert row is not None, type(error).__name__
        assert row.group(1) == str(answer_for(error).status), row.group(0)
    assert "never a 500" not in page


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_resolves_in_the_repository() -> None:
    """Read on GitHub, every link of the README and the pages leads to a file of the
    repository; a generated page has a placeholder there that says so."""
    hooks = _hooks()
    for uri in [*hooks.PAGES, "benchmarks.md"]:
        assert (DOCS / uri).read_text().startswith(hooks.PLACEHOLDER), uri
    broken = []
    for page in [*USER_PAGES, README]:
        text = FENCE.sub("", page.read_text())
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


def test_an_included_file_is_named_beside_its_include() -> None:
    """On GitHub an include shows as its `--8<--` line: the prose before it names the file."""
    found = 0
    for page in USER_PAGES:
        lines = page.read_text().splitlines()
        for n, line in enumerate(lines):
            m = re.fullmatch(r'--8<-- "([^"]+)"', line)
            if m:
                before = "\n".join(lines[max(0, n - 8):n])
                assert f"`{m.group(1)}`" in before, (page.relative_to(ROOT), m.group(1))
                found += 1
    assert found >= 5


def test_the_readme_python_uses_only_names_it_imports_or_defines() -> None:
    import ast
    import builtins

    (block,) = [body for _, lang, body in _blocks(README) if lang == "python"]
    tree = ast.parse(block)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx,
                                                                                 ast.Load)}
    assert used <= bound, sorted(used - bound)


def _ini_sections(*pages: Path) -> Iterator[tuple[Path, configparser.SectionProxy]]:
    """The ``[localstate]`` section of each ini block."""
    for page, lang, body in _blocks(*pages):
        if lang == "ini":
            cfg = configparser.ConfigParser(inline_comment_prefixes=None,
                                            comment_prefixes=(";", "#"), interpolation=None)
            cfg.read_string(body)
            if cfg.has_section("localstate"):
                yield page, cfg["localstate"]


def test_every_token_example_covers_the_owners_its_callers_use() -> None:
    """The docs' tokens give each caller the owners it uses and no more: a page that shows
    tasks shows a per-DAG token (`dag:<dag_id>/`, with its `/`) beside the triggerers'
    `asset_watcher:|trigger:` one; a connection's token covers the owner of the docs' task and
    the watcher it reads, and no other DAG's; a triggerer's `api_token` covers its triggers'
    owners (read-write with `sink = api`)."""
    from localstate._core.setting_specs import SPECS, ApiToken
    from localstate.airflow.hook import LocalStateHook

    by_secret: dict[str, ApiToken] = {}
    per_page: dict[Path, list[ApiToken]] = {}
    for page, section in _ini_sections(*USER_PAGES, README):
        if "api_tokens" in section:
            tokens: tuple[ApiToken, ...] = SPECS["api_tokens"].parse(section["api_tokens"])
            per_page.setdefault(page, []).extend(tokens)
            for token in tokens:
                # one secret, one scope, on every page and in either form
                known = by_secret.setdefault(token.secret, token)
                assert (known.role, known.owners) == (token.role, token.owners), (page, token)
                for prefix in token.owners:
                    if prefix.startswith("dag"):
                        assert re.fullmatch(r"dag:[\w.-]+/", prefix), (page, prefix)
    task = LocalStateHook.task_owner("etl", "load")
    for page, listed in per_page.items():
        where = page.relative_to(ROOT)
        text = page.read_text()
        if "LocalStateHook" in text or "dag:" in text:  # tasks are meant here
            dag_tokens = [t for t in listed if t.can_write and all(
                p.startswith(("dag:", "asset_watcher:")) for p in t.owners)
                and any(p.startswith("dag:") for p in t.owners)]
            assert dag_tokens, f"{where}: tokens for tasks, but none limited to a DAG"
        if any(t.allows("trigger:x") for t in listed):
            assert any(t.can_write and t.allows("asset_watcher:orders") and t.allows("trigger:x")
                       and not t.allows("dag:etl/load") for t in listed), where
    assert {README, DOCS / "deploy.md", DOCS / "usage.md",
            DOCS / "operations" / "security.md"} <= set(per_page)

    # the connections' tokens: the docs' task reads a watcher and writes its own owner
    connections = 0
    for page, argv in _commands(*USER_PAGES, README):
        assignment = argv[1] if argv[0] == "export" else argv[0]
        if assignment.startswith("AIRFLOW_CONN_LOCALSTATE"):
            token = by_secret[json.loads(assignment.split("=", 1)[1])["password"]]
            assert token.can_write, page
            assert token.allows(task), page
            assert token.allows("asset_watcher:orders"), page
            assert not token.allows("dag:reports/load"), page
            assert not token.allows("trigger:x"), page
            connections += 1
    assert connections >= 2
    # the triggerers' tokens (a shortened one, "6bq0...", stands for any)
    for page, section in _ini_sections(*USER_PAGES, README):
        secret = section.get("api_token", "")
        if secret and not secret.endswith("..."):
            token = by_secret[secret]
            assert token.allows("asset_watcher:orders"), page
            if section.get("sink") == "api":
                assert token.can_write, page
                assert token.allows("trigger:x"), page


def test_the_readme_headline_figures_are_the_benchmark_jsons() -> None:
    """The README's headline ratios are the SQLite benchmark's (docs/bench-sqlite.json, the
    benchmarks page's first table) at 1,000 triggers, with the date of that file."""
    data = json.loads((DOCS / "bench-sqlite.json").read_text())
    rows = {r["mode"]: r for r in data["rows"]
            if r["scenario"] == "distinct" and r["triggers"] == 1000}
    direct, local, memory = rows["direct"], rows["local"], rows["memory"]
    updates = round(local["sets_per_s"] / direct["sets_per_s"])
    fewer = round(direct["central_txns_per_s"] / local["central_txns_per_s"])
    in_memory = round(memory["sets_per_s"] / direct["sets_per_s"])
    text = " ".join(README.read_text().split())
    assert (f"local-first took {updates}× the updates of direct writes, with {fewer}× fewer "
            f"database transactions; memory durability {in_memory}×") in text
    assert f"The benchmark on {_hooks()._dated(DOCS / 'bench-sqlite.json')} (" in text
    assert f"{data['machine']['cpus']} shared x86-64 cores, SQLite" in text


#: the longest sentence the user docs' prose may have: one idea per sentence
MAX_SENTENCE_WORDS = 60


def test_user_docs_sentences_stay_short() -> None:
    """No sentence of the pages' and the README's prose (code blocks and tables aside) runs
    past `MAX_SENTENCE_WORDS` words: the long chains of clauses an operator cannot follow."""
    long = []
    for page in [*USER_PAGES, README]:
        text = FENCE.sub("", page.read_text())
        text = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("|"))
        for para in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", text):
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Za-z`*(\[])", " ".join(para.split())):
                if len(sentence.split()) > MAX_SENTENCE_WORDS:
                    long.append(f"{page.relative_to(ROOT)}: {sentence[:120]}...")
    assert not long, "\n".join(long)


def test_the_api_server_has_one_host_name_across_the_docs() -> None:
    """Every page names Airflow's API server the same way: `airflow-api-server:8080` (plain
    HTTP inside the deployment), or `airflow.example.com` where the page is about TLS."""
    hosts: dict[str, set[str]] = {}
    for name, text in _user_texts():
        for host in re.findall(r"(?:https?://|localstate://[^@\s]*@)([\w.-]+(?::\d+)?)/localstate\b",
                               text):
            hosts.setdefault(host, set()).add(name)
    assert "airflow-api-server:8080" in hosts
    assert set(hosts) <= {"airflow-api-server:8080", "airflow.example.com"}, hosts


def test_the_fleet_state_is_called_stalled_everywhere() -> None:
    """`stalled` is the state's name; `stale` survives only as the REST schema's deprecated
    alias, and says so (as the changelog does)."""
    for name, text in _user_texts():
        for line in text.splitlines():
            if re.search(r"\bstale\b", line):
                assert "earlier name" in line, f"{name}: {line}"


def test_what_the_pages_say_is_what_the_code_does() -> None:
    """The README's live toggle needs `watch_config` (off by default); `cleanup_flush_timeout`
    is a class attribute of the trigger mixin, not a setting; the DB manager needs no
    configuration (the provider info declares it), as the architecture and deploy pages say;
    the plugin's server keeps no store, as the README says too; a lost disk loses one
    flush interval only while the central store answers, the whole backlog in an outage."""
    import typing

    from localstate._core.setting_specs import SPECS
    from localstate.airflow.provider import get_provider_info
    from localstate.airflow.trigger import StateEnabledTrigger

    readme = " ".join(README.read_text().split())
    assert SPECS["watch_config"].default is False
    assert "applies at the next start, or live with `watch_config = true`" in readme

    assert "cleanup_flush_timeout" not in SPECS
    hints = typing.get_type_hints(StateEnabledTrigger)
    assert typing.get_origin(hints["cleanup_flush_timeout"]) is typing.ClassVar
    triggers = " ".join((DOCS / "guides" / "triggers.md").read_text().split())
    assert (f"up to {StateEnabledTrigger.cleanup_flush_timeout:g} s for that flush. This is the "
            "class attribute `cleanup_flush_timeout`, not a setting") in triggers

    assert get_provider_info()["db-managers"] == [
        "localstate.airflow.db_manager.LocalStateDBManager"]
    architecture = (DOCS / "architecture.md").read_text()
    assert "`airflow db migrate` finds it with no configuration" in architecture
    deploy = " ".join((DOCS / "deploy.md").read_text().split())
    assert "`airflow db migrate` also creates localstate's tables" in deploy
    # no page asks for it in [database] external_db_managers
    assert not [name for name, text in _user_texts() if "external_db_managers" in text]

    # (what it does: test_the_plugins_server_keeps_no_store_of_its_own)
    ui = " ".join((DOCS / "operations" / "ui.md").read_text().split())
    assert "The API server holds no store of its own" in ui
    assert "keeps no store of its own" in " ".join(README.read_text().split())

    durability = " ".join((DOCS / "guides" / "durability.md").read_text().split())
    assert ("While the central store answers, that is about one `flush_interval` plus a flush's "
            "time. During a central outage it is the whole backlog") in durability
    assert "and the whole backlog during an outage" in deploy


async def test_the_plugins_server_keeps_no_store_of_its_own(tmp_path: Path) -> None:
    """What README, the UI guide and the status page say: the app the plugin mounts in
    Airflow's API server (`open_app`, as `open_serving` builds it) writes each request to the
    central DB before it answers, and opens no cache file."""
    import sqlite3
    from urllib.parse import quote

    import httpx

    from localstate.airflow._serving import open_app

    central, cache_dir = tmp_path / "airflow.db", tmp_path / "cache"
    token = "plugin-token-0123456789abcdef"
    app, close = await open_app(f"sqlite:///{central}", asset_states=False,
                                api_tokens=f"{token}:read-write:*", cache_dir=str(cache_dir))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://airflow-api-server:8080",
                                     headers={"Authorization": f"Bearer {token}"}) as client:
            r = await client.put(f"/api/v1/state/{quote('dag:etl/load', safe='')}/cursor",
                                 json={"value": 42})
            assert r.status_code == 200, r.text
            # committed before the answer: another connection sees it at once
            with sqlite3.connect(central) as db:
                rows = db.execute("SELECT value FROM localstate_state WHERE owner = "
                                  "'dag:etl/load' AND key = 'cursor'").fetchall()
            assert rows == [("42",)]
            status = (await client.get("/api/v1/status")).json()
    finally:
        await close()
    assert status["cache_enabled"] is False
    assert status["dirty_keys"] == 0
    assert not cache_dir.exists()


def _resolves(dotted: str) -> bool:
    """An importable module, or an attribute of one."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for name in parts[end:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


#: words before a name that mark it as one that no longer exists
_OLD_NAME_BEFORE = re.compile(r"\bimported\b|\b(?:old|earlier) names?\b|\bwas\b|\bmoved\b")


def test_every_localstate_name_the_docs_give_exists() -> None:
    """A module, class or function the changelog, the README or a page names (`localstate.x`,
    `localstate/x.py`) is one the code has, or is a logger or metric name the code uses: no
    module that was renamed or removed. An old name the changelog gives as old ("`old` is
    `new`", "code that imported `old`") is left out; its new name is checked."""
    from localstate._metrics import COUNTERS, GAUGES, OWNER_LAG, PRUNE_COUNTERS, TIMER

    loggers: set[str] = set()
    for base in (ROOT / "localstate", ROOT / "sync"):
        for source in base.rglob("*.py"):
            loggers |= set(re.findall(r'getLogger\(\s*"([^"]+)"', source.read_text()))
    metrics = {f"localstate.{name}" for name in (*COUNTERS.values(), *GAUGES.values(), TIMER,
                                                 *PRUNE_COUNTERS, OWNER_LAG)}
    assert "localstate.sync.worker" in loggers
    missing, checked = [], 0
    for page in [ROOT / "CHANGELOG.md", README, *USER_PAGES]:
        text = page.read_text()
        for m in re.finditer(r"`(localstate(?:\.[A-Za-z_]\w*)+)(?:\.\*)?`", text):
            checked += 1
            name = m.group(1)
            if _OLD_NAME_BEFORE.search(text[max(0, m.start() - 80):m.start()]) or \
                    text[m.end():].startswith(" is `"):
                continue  # given as an old name: "`old` is `new`", "code that imported `old`"
            if not (_resolves(name) or name in loggers or name in metrics):
                missing.append(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
                               f": {name}")
        for m in re.finditer(r"`(localstate/[\w./-]+)`", text):
            checked += 1
            if not (ROOT / m.group(1)).exists():
                missing.append(f"{page.relative_to(ROOT)}: {m.group(1)}")
    assert checked > 100
    assert not missing, "\n".join(missing)


def test_the_readmes_list_of_commands_is_the_cli_s() -> None:
    """README's "`localstate --help` lists every command" names each one, no more."""
    import argparse

    from localstate.cli import build_parser

    def commands(parser: argparse.ArgumentParser, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for action in parser._actions:  # argparse keeps its subparsers nowhere public
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    inner = commands(sub, f"{prefix}{name} ")
                    out |= inner or {f"{prefix}{name}"}
        return out

    text = README.read_text()
    listed = text.split("lists every command:", 1)[1].split(".\n", 1)[0]
    assert set(re.findall(r"`([a-z ]+)`", listed)) == commands(build_parser())
