"""The documentation site and the README: they build, they are complete, and their code works.

* `mkdocs build --strict` passes (broken links, missing pages, bad snippets and docstrings
  fail it), with the reference pages generated from the code by ``docs/hooks/reference.py``;
* every module of ``localstate/`` and ``sync/`` appears in the architecture page, every typed
  error in the troubleshooting page, every setting, command and route in the references;
* every code block of the user docs is run (Python, ``python -c``), checked by the parser that
  will read it (airflow.cfg blocks by localstate's setting parsers and Airflow's own config,
  commands by the ``localstate`` and ``airflow`` argument parsers, JSON by a JSON parser), or
  included from a tested file;
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


def test_the_architecture_page_names_every_module() -> None:
    page = (DOCS / "architecture.md").read_text()
    modules = [p.relative_to(ROOT).as_posix()
               for base in (ROOT / "localstate", ROOT / "sync") for p in base.rglob("*.py")]
    assert len(modules) > 100
    missing = []
    for module in modules:
        if "/_migrations/versions/" in module:  # each revision: one migration of sync/schema.py
            module = module.rsplit("/", 1)[0] + "/"
        if f"`{module}`" not in page:
            missing.append(module)
    assert not missing, f"add these modules to docs/architecture.md: {sorted(set(missing))}"


def test_troubleshooting_lists_every_typed_error() -> None:
    import localstate.errors as errors

    page = _hooks().troubleshooting_page()
    classes = [name for name in errors.__all__
               if isinstance(getattr(errors, name), type)]
    assert len(classes) >= 19
    for name in classes:
        assert f"\n## {name}\n" in page, name


def test_the_configuration_reference_has_every_setting() -> None:
    from localstate._setting_specs import SPECS

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
    from localstate._metrics import COUNTERS, GAUGES, PRUNE_COUNTERS, TIMER

    page = _hooks().metrics_page()
    for name in (*COUNTERS.values(), *GAUGES.values(), TIMER, *PRUNE_COUNTERS):
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
    from localstate._config import Settings

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
    """The Kubernetes page's commands: the files each names exist, and the image built and
    pushed is the one the values file runs (what the values say is checked by
    tests/packaging/test_kubernetes.py)."""
    import yaml

    files = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-f"]
    assert files, where
    assert all((ROOT / f).is_file() for f in files), where
    values = yaml.safe_load((ROOT / "deploy/kubernetes/values.yaml").read_text())
    image = f"{values['images']['airflow']['repository']}:{values['images']['airflow']['tag']}"
    if argv[0] == "docker":
        assert argv[1:2] == ["build"], where
        assert argv[-1] == ".", where
        assert argv[argv.index("-t") + 1] == image, where
    elif argv[0] == "kubectl":
        assert argv[1:2] == ["apply"], where
    else:
        assert argv[1:3] == ["upgrade", "--install"], where
        assert argv[4] == "apache-airflow/airflow", where


def test_shell_commands_are_ones_the_tools_accept(tmp_path: Path) -> None:
    """Each command line of a ```sh block is run (``python -c``) or parsed by the program that
    will read it; a command no rule knows fails the test."""
    from localstate._config import Settings
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
        elif argv in (["python", "-m", "build"], ["python", "-m", "pip", "install", "build"]):
            pass  # tests/packaging/test_wheel.py runs the build
        elif program == "pip" and argv[1] == "install":
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

    from localstate._config import Settings
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
    from localstate._protocol import answer_for
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
