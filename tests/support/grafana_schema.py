"""Type-check a Grafana dashboard JSON against @grafana/schema's TypeScript types.

The dashboard becomes one object literal assigned to a const typed as the schema's
``Dashboard``; every panel in it is additionally checked with ``satisfies`` against a panel
type built from its plugin's ``Options`` and ``FieldConfig`` (timeseries, table, stat, ...).
TypeScript's excess-property check then rejects any field the schema does not declare, at
every level that has a declared type, and ``tsc --strict`` rejects wrong value types.

Errors are reported as JSON paths into the dashboard (``$.panels[3].options.footer``).
TypeScript reports only the first unknown property of each object literal; ``--all``
deletes each reported unknown property and checks again until none are left, so that
every unknown property is listed.

Besides the types, panel ids are checked: present, positive and unique (a rule of Grafana's
dashboard model that the schema's types cannot express).

Several versions of @grafana/schema can be installed side by side: the newest under its own
name, older ones under npm aliases (``"grafana-schema-11": "npm:@grafana/schema@11.6.16"``);
``schema_packages`` lists them and ``package`` picks the one a check types against.

Usage: python -m tests.support.grafana_schema [--all] [--verbose] [--keep] [--npm-dir DIR] [--package NAME] DASHBOARD.json
From Python: check(dashboard, npm_dir) or check_many(dashboards, npm_dir) (one tsc run for all).
Stdlib only; needs node and ``npm ci --prefix tests/k8s`` (which installs @grafana/schema and TypeScript).
Exit status: 0 clean, 1 errors found, 2 usage or setup problem.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.typescript import run_tsc as compile_typescript

HERE = Path(__file__).resolve().parent
NPM_DIR = HERE.parent / "k8s"
"""The npm folder whose node_modules hold @grafana/schema and TypeScript."""
SCHEMA = "@grafana/schema"
"""The schema's npm name, and the name its default version is installed under."""
COMPOSABLE = "dist/esm/raw/composable"
"""Where the panel plugins' types lie inside the package."""

# Panel plugin id -> (folder and module name under COMPOSABLE, has a FieldConfig type).
# Module names are the subpaths that @grafana/schema's package.json "exports" declares.
PANEL_TYPES: dict[str, tuple[str, str, bool]] = {
    "timeseries": ("timeseries", "TimeSeries", True),
    "table": ("table", "Table", True),
    "stat": ("stat", "Stat", False),
    "gauge": ("gauge", "Gauge", False),
    "bargauge": ("bargauge", "BarGauge", False),
    "barchart": ("barchart", "BarChart", True),
    "piechart": ("piechart", "PieChart", True),
    "heatmap": ("heatmap", "Heatmap", True),
    "histogram": ("histogram", "Histogram", True),
    "state-timeline": ("statetimeline", "StateTimeline", True),
    "status-history": ("statushistory", "StatusHistory", True),
    "candlestick": ("candlestick", "Candlestick", True),
    "trend": ("trend", "Trend", True),
    "xychart": ("xychart", "XYChart", True),
    "text": ("text", "Text", False),
    "logs": ("logs", "Logs", False),
    "nodeGraph": ("nodegraph", "NodeGraph", False),
    "geomap": ("geomap", "Geomap", False),
    "canvas": ("canvas", "Canvas", False),
    "news": ("news", "News", False),
    "dashlist": ("dashboardlist", "DashboardList", False),
    "annolist": ("annotationslist", "AnnotationsList", False),
    "debug": ("debug", "Debug", False),
}

PRELUDE = """\
import type { AnnotationQuery, Dashboard, FieldConfig, FieldConfigSource, Panel, RowPanel } from "{package}";
{imports}

// JSON carries an enum's value, not the enum: accept each string enum's values as string
// literals ("table" for LegendDisplayMode.Table). Numeric enums already accept their values.
type IsAny<T> = 0 extends 1 & T ? true : false;
type Loose<T> = IsAny<T> extends true
  ? T
  : T extends string
    ? `${T}`
    : T extends number | boolean | bigint | null | undefined
      ? T
      : T extends ReadonlyArray<infer U>
        ? Array<Loose<U>>
        : T extends object
          ? { [K in keyof T]: Loose<T[K]> }
          : T;

// A panel of one plugin: its options and its fieldConfig.defaults.custom typed by the plugin's
// schema (the generic Panel types both as Record<string, unknown>, which checks nothing).
interface PanelOf<Type extends string, Options, Custom>
  extends Omit<Loose<Panel>, "type" | "options" | "fieldConfig"> {
  type: Type;
  options?: Loose<Options>;
  fieldConfig?: {
    defaults: Omit<Loose<FieldConfig>, "custom"> & { custom?: Loose<Partial<Custom>> };
    overrides: Loose<FieldConfigSource>["overrides"];
  };
}
type NoCustom = Record<string, never>;
type Row = Loose<RowPanel>;
// An annotation's query is its data source's, which @grafana/schema leaves untyped for panels too
// (Panel.targets: Array<Record<string, unknown>>); it needs a refId. The Prometheus data source reads its
// annotation options beside the query (prepareAnnotation, processEvents): typed here, since the schema has none.
type AnnotationQueryTarget = Record<string, unknown> & { refId: string };
type PrometheusAnnotation = Omit<Loose<AnnotationQuery>, "target"> & {
  target?: AnnotationQueryTarget;
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
};
type AnyPanel = Loose<Panel>;

interface Panels {
{panels}
}

// Guard: a type that failed to resolve inside the library (hidden by --skipLibCheck) would be
// any and check nothing; fail instead.
type AllFalse<T> = { [K in keyof T]: T[K] extends false ? true : K }[keyof T];
type OptionsAny = { [K in keyof Panels]: IsAny<NonNullable<Panels[K]["options"]>> };
type CustomAny = { [K in keyof Panels]: IsAny<NonNullable<NonNullable<Panels[K]["fieldConfig"]>["defaults"]["custom"]>> };
export const optionsTyped: true = null as unknown as AllFalse<OptionsAny>;
export const customTyped: true = null as unknown as AllFalse<CustomAny>;
export const dashboardTyped: true = null as unknown as (IsAny<Loose<Dashboard>> extends false ? true : "Dashboard");
"""


@dataclass(frozen=True)
class Problem:
    """One error: where in the dashboard, and what."""

    path: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.code} {self.message}"

    def short(self) -> str:
        """The first line of the message, with long type texts elided."""
        first = self.message.split("\n")[0]
        return f"{self.path}: {self.code} " + re.sub(r"'([^']{60})[^']{20,}'", r"'\1...'", first)


def path_str(path: tuple[Any, ...]) -> str:
    """A JSON path, from a line's path without its leading dashboard index."""
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class Writer:
    """Writes a JSON value as TypeScript, one property per line, remembering each line's JSON path."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.paths: list[tuple[Any, ...]] = []

    def add(self, text: str, path: tuple[Any, ...]) -> None:
        self.lines.append(text)
        self.paths.append(path)

    def value(self, value: Any, path: tuple[Any, ...], depth: int, head: str, tail: str, panel: bool = False) -> None:
        pad = "  " * depth
        suffix = ""
        if len(path) == 4 and path[1:3] == ("annotations", "list") and isinstance(value, dict):
            suffix = " satisfies PrometheusAnnotation as Loose<AnnotationQuery>"
        if panel and isinstance(value, dict):
            kind = value.get("type")
            if kind == "row":
                suffix = " satisfies Row"
            elif kind in PANEL_TYPES:
                suffix = f" satisfies Panels[{json.dumps(kind)}]"
            else:
                suffix = " satisfies AnyPanel"
        if isinstance(value, dict) and value:
            self.add(f"{pad}{head}{{", path)
            for key, item in value.items():
                # Panels of the dashboard, and of a row, are each checked against their plugin's type.
                is_panels = key == "panels" and (len(path) == 1 or panel)
                if is_panels and isinstance(item, list) and item:
                    self.add(f"{pad}  {json.dumps(key)}: [", path + (key,))
                    for i, p in enumerate(item):
                        self.value(p, path + (key, i), depth + 2, "", ",", panel=True)
                    self.add(f"{pad}  ],", path + (key,))
                else:
                    self.value(item, path + (key,), depth + 1, f"{json.dumps(key)}: ", ",")
            self.add(f"{pad}}}{suffix}{tail}", path)
        elif isinstance(value, list) and value:
            self.add(f"{pad}{head}[", path)
            for i, item in enumerate(value):
                self.value(item, path + (i,), depth + 1, "", ",")
            self.add(f"{pad}]{tail}", path)
        else:
            # Scalars, {} and []; JSON strings and numbers are valid TypeScript literals.
            self.add(f"{pad}{head}{json.dumps(value)}{suffix}{tail}", path)


def schema_packages(npm_dir: Path = NPM_DIR) -> dict[str, str]:
    """Each @grafana/schema that ``npm_dir``'s package.json installs: the name it is installed under, and
    its pinned version; oldest first."""
    dependencies: dict[str, str] = json.loads((npm_dir / "package.json").read_text())["dependencies"]
    pinned = {
        name: spec.removeprefix(f"npm:{SCHEMA}@")
        for name, spec in dependencies.items()
        if name == SCHEMA or spec.startswith(f"npm:{SCHEMA}@")
    }
    return dict(sorted(pinned.items(), key=lambda item: tuple(int(part) for part in item[1].split("."))))


def installed_version(npm_dir: Path, package: str) -> str | None:
    """The version of @grafana/schema installed under ``package`` in ``npm_dir``, or None."""
    manifest = npm_dir / "node_modules" / package / "package.json"
    if not manifest.is_file():
        return None
    installed: dict[str, str] = json.loads(manifest.read_text())
    return installed["version"] if installed.get("name") == SCHEMA else None


def module_suffix(npm_dir: Path, package: str) -> str:
    """What the import of a panel plugin's types needs after the module's name: nothing where the
    package's "exports" list each module (@grafana/schema 12 and later), ``.js`` where they map all of
    ``dist/`` at once (11.6), so that TypeScript finds the module's ``.d.ts`` beside its ``.js``."""
    manifest = json.loads((npm_dir / "node_modules" / package / "package.json").read_text())
    folder, module, _ = PANEL_TYPES["timeseries"]
    listed = f"./{COMPOSABLE}/{folder}/panelcfg/x/{module}PanelCfg_types.gen"
    return "" if listed in manifest.get("exports", {}) else ".js"


def typescript(dashboards: list[dict[str, Any]], package: str = SCHEMA, suffix: str = "") -> Writer:
    """The check as TypeScript against the @grafana/schema installed under ``package``: imports and
    types, then one typed literal per dashboard. ``suffix`` ends each panel module's name (``module_suffix``).

    Each line's path starts with the dashboard's index in ``dashboards``."""
    imports, panels = [], []
    for plugin, (folder, module, has_custom) in PANEL_TYPES.items():
        alias = f"P_{folder}"
        spec = f"{package}/{COMPOSABLE}/{folder}/panelcfg/x/{module}PanelCfg_types.gen{suffix}"
        imports.append(f'import type * as {alias} from "{spec}";')
        custom = f"{alias}.FieldConfig" if has_custom else "NoCustom"
        panels.append(f"  {json.dumps(plugin)}: PanelOf<{json.dumps(plugin)}, {alias}.Options, {custom}>;")
    prelude = (
        PRELUDE.replace("{package}", package)
        .replace("{imports}", "\n".join(imports))
        .replace("{panels}", "\n".join(panels))
    )
    writer = Writer()
    for line in prelude.splitlines():
        writer.add(line, ("<prelude>",))
    for i, dashboard in enumerate(dashboards):
        writer.value(dashboard, (i,), 0, f"export const dashboard{i}: Loose<Dashboard> = ", ";")
    return writer


ERROR = re.compile(r"^(?P<file>.+?)\((?P<line>\d+),(?P<col>\d+)\): error (?P<code>TS\d+): (?P<msg>.*)$")
EXCESS = re.compile(
    r"(?:Object literal may only specify known properties, and|but) '\"?(?P<key>[^'\"]+)\"?' does not exist"
)


def run_tsc(writer: Writer, npm_dir: Path, keep: bool) -> tuple[list[tuple[tuple[Any, ...], str, str]], str]:
    """Compile; each error as (JSON path, code, message), and tsc's raw output."""
    # The .ts file goes to a temporary folder that links the npm folder's node_modules, so
    # that nothing is written beside the checked-in package.json (and parallel runs are safe).
    modules = (npm_dir / "node_modules").resolve()
    work = Path(tempfile.mkdtemp(prefix="dashboard-check-"))
    (work / "node_modules").symlink_to(modules, target_is_directory=True)
    (work / "package.json").write_text('{"private": true, "type": "module"}\n')
    source = work / "dashboard.ts"
    source.write_text("\n".join(writer.lines) + "\n")
    try:
        result = compile_typescript(modules, source, work)
    finally:
        if keep:
            print(f"kept {source}", file=sys.stderr)
        else:
            shutil.rmtree(work)
    errors = []
    current: list[Any] | None = None
    for line in (result.stdout + result.stderr).splitlines():
        match = ERROR.match(line)
        if match:
            number = int(match["line"]) - 1
            path = writer.paths[number] if 0 <= number < len(writer.paths) else ("<unknown>",)
            current = [path, match["code"], match["msg"]]
            errors.append(current)
        elif current is not None and line.startswith(" "):
            current[2] += "\n    " + line.strip()
    if result.returncode != 0 and not errors:
        raise RuntimeError(f"tsc failed without a located error:\n{result.stdout}{result.stderr}")
    return [(p, c, m) for p, c, m in errors], result.stdout


def delete(document: Any, path: tuple[Any, ...]) -> bool:
    node = document
    for part in path[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(node, dict) and path and path[-1] in node:
        del node[path[-1]]
        return True
    return False


def panel_id_problems(dashboard: dict[str, Any]) -> list[Problem]:
    """Every panel, rows and nested panels included, needs a positive id unique in the dashboard."""
    problems: list[Problem] = []
    seen: dict[int, str] = {}

    def walk(items: list[Any], base: tuple[Any, ...]) -> None:
        for i, panel in enumerate(items):
            if not isinstance(panel, dict):
                continue
            path = base + (i,)
            pid = panel.get("id")
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                problems.append(
                    Problem(path_str(path + ("id",)), "ids", f"panel id must be a positive integer, is {pid!r}")
                )
            elif pid in seen:
                problems.append(Problem(path_str(path + ("id",)), "ids", f"panel id {pid} also used at {seen[pid]}"))
            else:
                seen[pid] = path_str(path)
            if isinstance(panel.get("panels"), list):
                walk(panel["panels"], path + ("panels",))

    walk(dashboard.get("panels") or [], ("panels",))
    return problems


def check_many(
    dashboards: list[dict[str, Any]],
    npm_dir: Path,
    every: bool = False,
    keep: bool = False,
    package: str = SCHEMA,
) -> list[tuple[list[Problem], set[str]]]:
    """For each dashboard, its type errors against the @grafana/schema installed under ``package``
    (every unknown property with ``every``) and panel id problems, and the panel types it has that
    no schema covers; one tsc run per round."""
    documents = json.loads(json.dumps(dashboards))
    suffix = module_suffix(npm_dir, package)
    problems: list[list[Problem]] = [[] for _ in documents]
    untyped: list[set[str]] = [set() for _ in documents]
    for _ in range(50):
        writer = typescript(documents, package, suffix)
        errors, _ = run_tsc(writer, npm_dir, keep)
        for path, code, message in errors:
            if path == ("<prelude>",) or not isinstance(path[0], int):
                raise RuntimeError(f"the type prelude does not compile: {code} {message}")
            found, where = problems[path[0]], path_str(path[1:])
            # The panel's satisfies and the dashboard's own type can report the same thing: keep one.
            if not any(p.path == where and p.code == code for p in found):
                found.append(Problem(where, code, message))
        if not every:
            break
        removed = False
        for path, _code, message in errors:
            match = EXCESS.search(message)
            if match and len(path) > 1 and path[-1] == match["key"]:
                removed |= delete(documents[path[0]], path[1:])
        if not removed:
            break
    for i, dashboard in enumerate(dashboards):
        untyped[i] = panel_types(dashboard) - set(PANEL_TYPES) - {"row"}
        problems[i] += panel_id_problems(dashboard)
    return list(zip(problems, untyped, strict=True))


def check(
    dashboard: dict[str, Any], npm_dir: Path, every: bool = False, keep: bool = False, package: str = SCHEMA
) -> tuple[list[Problem], set[str]]:
    """``check_many`` of one dashboard."""
    return check_many([dashboard], npm_dir, every, keep, package)[0]


def panel_types(dashboard: dict[str, Any]) -> set[str]:
    kinds: set[str] = set()
    for panel in dashboard.get("panels") or []:
        if isinstance(panel, dict):
            kinds.add(str(panel.get("type")))
            kinds |= {str(p.get("type")) for p in panel.get("panels") or [] if isinstance(p, dict)}
    return kinds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dashboard", type=Path)
    parser.add_argument("--all", action="store_true", help="list every unknown property, not the first per object")
    parser.add_argument("--keep", action="store_true", help="keep the generated .ts file")
    parser.add_argument("--verbose", action="store_true", help="print tsc's whole messages")
    parser.add_argument(
        "--npm-dir", type=Path, default=NPM_DIR, help="folder with node_modules (@grafana/schema, typescript)"
    )
    parser.add_argument(
        "--package", default=SCHEMA, help=f"the name a @grafana/schema is installed under (default {SCHEMA})"
    )
    args = parser.parse_args(argv)
    if installed_version(args.npm_dir, args.package) is None:
        print(f"no @grafana/schema at node_modules/{args.package} in {args.npm_dir}: run npm ci there", file=sys.stderr)
        return 2
    dashboard = json.loads(args.dashboard.read_text())
    try:
        problems, untyped = check(dashboard, args.npm_dir, every=args.all, keep=args.keep, package=args.package)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 2
    for kind in sorted(untyped):
        print(
            f"note: panel type {kind!r} has no schema here; only the generic Panel fields were checked", file=sys.stderr
        )
    for problem in problems:
        print(problem if args.verbose else problem.short())
    print(f"{len(problems)} problem(s) in {args.dashboard}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
