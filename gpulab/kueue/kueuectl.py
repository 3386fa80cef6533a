"""kueuectl, the ``kubectl kueue`` plugin: list and stop/resume queues and Workloads.

Mirrors kubernetes-sigs/kueue v0.19.2 cmd/kueuectl/app: ``list workload`` (aliases kwl,
kueueworkload, kueueworkloads; -A, -c/--clusterqueue, -q/--localqueue, --status,
-l/--selector, --field-selector; the POSITION IN QUEUE column from the visibility API's
positionInLocalQueue), ``list clusterqueue`` (cq; --active), ``list localqueue`` (lq; -A,
-c), ``stop workload|clusterqueue|localqueue`` (``spec.active=false``; ``stopPolicy``
HoldAndDrain, or Hold with --keep-already-running) and ``resume ...`` (``spec.active=true``,
``stopPolicy: None``), each with --dry-run none|server|client and merge patches as
upstream. Tables are printed as kubectl's table printer and tabwriter print them
(headers upper-cased, min width 6, padding 3). Lab differences: -o takes only
json|yaml|name; no ``list pods``/``resourceflavor``, ``create``, ``delete``, ``--for``.

Run as ``gpulab kueuectl ...`` or, once installed, ``kubectl kueue ...`` (console script
``kubectl-kueue`` on PATH).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpulab.errors import CLIError, UserError
from gpulab.kube import api_client, default_kubeconfig
from gpulab.kueue import api
from gpulab.kueue.visibility import GROUP as VISIBILITY_GROUP

Obj = dict[str, Any]
LIST_LIMIT = 100  # defaultListRequestLimit
STATUSES = ("all", "pending", "quotareserved", "admitted", "finished")
CRD_TYPE_MAX_LENGTH = 20


# -- kubectl's table printer ---------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, (hours // 24) % 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], no_headers: bool = False) -> str:
    """printers.NewTablePrinter through GetNewTabWriter: upper-cased headers, each column
    but the last padded to max(6, widest cell + 3)."""
    lines = [[_cell(c) for c in row] for row in rows]
    if not no_headers:
        lines.insert(0, [h.upper() for h in headers])
    if not lines:
        return ""
    widths = [max(6, max(len(line[i]) for line in lines) + 3) for i in range(len(headers) - 1)]
    out = []
    for line in lines:
        padded = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.append("".join(padded) + line[-1])
    return "\n".join(out) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def _age(obj: Obj, now: float) -> str:
    return human_duration(now - _ts((obj.get("metadata") or {}).get("creationTimestamp")))


def _ts(value: str | None) -> float:
    if not value:
        return 0.0
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _cond(obj: Obj, kind: str) -> Obj | None:
    return next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind),
        None,
    )


def _true(obj: Obj, kind: str) -> bool:
    return (_cond(obj, kind) or {}).get("status") == "True"


# -- what the commands read -----------------------------------------------------------------


def workload_status(wl: Obj) -> str:
    """pkg/workload.Status."""
    if _true(wl, api.FINISHED):
        return "finished"
    if _true(wl, api.ADMITTED):
        return "admitted"
    if _true(wl, api.QUOTA_RESERVED):
        return "quotaReserved"
    return "pending"


class Client:
    """The calls kueuectl makes (the Kueue clientset, discovery, the visibility API)."""

    def __init__(self, api_client_: client.ApiClient) -> None:
        self.api = api_client_
        self.custom = client.CustomObjectsApi(api_client_)

    def list(self, plural: str, namespace: str | None, selector: str, fields: str) -> list[Obj]:
        items: list[Obj] = []
        cont = None
        while True:
            kw: dict[str, Any] = {"limit": LIST_LIMIT, "label_selector": selector}
            if fields:
                kw["field_selector"] = fields
            if cont:
                kw["_continue"] = cont
            if namespace is None:
                page = self.custom.list_cluster_custom_object(api.GROUP, api.VERSION, plural, **kw)
            else:
                page = self.custom.list_namespaced_custom_object(
                    api.GROUP, api.VERSION, namespace, plural, **kw
                )
            items += page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items

    def get(self, plural: str, namespace: str | None, name: str) -> Obj:
        if namespace is None:
            return self.custom.get_cluster_custom_object(api.GROUP, api.VERSION, plural, name)
        return self.custom.get_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, plural, name
        )

    def patch(self, plural: str, namespace: str | None, name: str, body: Obj, dry: bool) -> Obj:
        """A merge patch (client.MergeFrom), as a dry run on the server with ``dry``."""
        ns = f"/namespaces/{namespace}" if namespace else ""
        path = f"/apis/{api.GROUP}/{api.VERSION}{ns}/{plural}/{name}"
        query = [("dryRun", "All")] if dry else []
        return self._call("PATCH", path, query, body, "application/merge-patch+json")

    def pending_workloads(self, cluster_queue: str) -> list[Obj] | None:
        """GetPendingWorkloadsSummary of visibility v1beta2 (None when not found)."""
        path = f"/apis/{VISIBILITY_GROUP}/v1beta2/clusterqueues/{cluster_queue}/pendingworkloads"
        try:
            return list(self._call("GET", path, [], None).get("items") or [])
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def resources(self, group_version: str) -> list[Obj] | None:
        """ServerResourcesForGroupVersion (None when not found)."""
        path = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        try:
            return list(self._call("GET", path, [], None).get("resources") or [])
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _call(
        self, method: str, path: str, query: list[Any], body: Obj | None, ctype: str = ""
    ) -> Obj:
        headers = {"Accept": "application/json"}
        if ctype:
            headers["Content-Type"] = ctype
        resp = self.api.call_api(
            path,
            method,
            query_params=query,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        return json.loads(resp.data or b"{}")


# -- list --------------------------------------------------------------------------------------


def workload_rows(
    kc: Client,
    workloads: list[Obj],
    now: float,
    with_namespace: bool,
) -> list[list[Any]]:
    """listWorkloadPrinter rows, with the LocalQueues, the pending positions and the owners'
    resource types looked up as upstream's Run does."""
    local_queues: dict[str, Obj | None] = {}
    for wl in workloads:
        if _admitted_cq(wl):
            continue
        key = _lq_key(wl)
        if key not in local_queues:
            try:
                local_queues[key] = kc.get(
                    "localqueues", wl["metadata"]["namespace"], wl["spec"].get("queueName", "")
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                local_queues[key] = None
    summaries: dict[str, list[Obj] | None] = {}
    positions: dict[str, int] = {}
    for wl in workloads:
        if workload_status(wl) != "pending":
            continue
        cq = _cluster_queue_of(wl, local_queues)
        if not cq:
            continue
        if cq not in summaries:
            summaries[cq] = kc.pending_workloads(cq)
        for item in summaries[cq] or []:
            meta = item["metadata"]
            if (meta["name"], meta.get("namespace")) == (
                wl["metadata"]["name"],
                wl["metadata"]["namespace"],
            ):
                positions[_key(wl)] = item["positionInLocalQueue"]
    resource_lists: dict[str, list[Obj] | None] = {}
    for wl in workloads:
        for ref in wl["metadata"].get("ownerReferences") or []:
            if ref["apiVersion"] not in resource_lists:
                resource_lists[ref["apiVersion"]] = kc.resources(ref["apiVersion"])
    rows = []
    for wl in workloads:
        row = [
            wl["metadata"]["name"],
            ", ".join(_crd_types(wl, resource_lists)),
            ", ".join(
                dict.fromkeys(r["name"] for r in wl["metadata"].get("ownerReferences") or [])
            ),
            wl["spec"].get("queueName", ""),
            _cluster_queue_of(wl, local_queues),
            workload_status(wl).upper(),
            str(positions[_key(wl)]) if _key(wl) in positions else "",
            _exec_time(wl, now),
            _age(wl, now),
        ]
        rows.append([wl["metadata"]["namespace"], *row] if with_namespace else row)
    return rows


WORKLOAD_COLUMNS = (
    "Name",
    "Job Type",
    "Job Name",
    "LocalQueue",
    "ClusterQueue",
    "Status",
    "Position in Queue",
    "Exec Time",
    "Age",
)
CLUSTER_QUEUE_COLUMNS = (
    "Name",
    "Cohort",
    "Pending Workloads",
    "Admitted Workloads",
    "Active",
    "Age",
)
LOCAL_QUEUE_COLUMNS = ("Name", "ClusterQueue", "Pending Workloads", "Admitted Workloads", "Age")


def _key(wl: Obj) -> str:
    return f"{wl['metadata']['namespace']}/{wl['metadata']['name']}"


def _lq_key(wl: Obj) -> str:
    return f"{wl['metadata']['namespace']}/{wl['spec'].get('queueName', '')}"


def _admitted_cq(wl: Obj) -> str:
    return ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue") or ""


def _cluster_queue_of(wl: Obj, local_queues: dict[str, Obj | None]) -> str:
    cq = _admitted_cq(wl)
    if cq:
        return cq
    lq = local_queues.get(_lq_key(wl))
    return (lq or {}).get("spec", {}).get("clusterQueue", "")


def _exec_time(wl: Obj, now: float) -> str:
    admitted = _cond(wl, api.ADMITTED)
    if admitted is None or admitted.get("status") != "True":
        return ""
    finished = _cond(wl, api.FINISHED)
    end = now
    if finished is not None and finished.get("status") == "True":
        end = _ts(finished.get("lastTransitionTime"))
    return human_duration(end - _ts(admitted.get("lastTransitionTime")))


def _crd_types(wl: Obj, resource_lists: dict[str, list[Obj] | None]) -> list[str]:
    """crdTypes: the owners' resource types, ``<singular>[.<group>]``, cut at 20."""
    types: dict[str, None] = {}
    for ref in wl["metadata"].get("ownerReferences") or []:
        for r in resource_lists.get(ref["apiVersion"]) or []:
            if r.get("kind") == ref["kind"] and r.get("singularName"):
                name = ".".join(p for p in (r["singularName"], r.get("group", "")) if p)
                if len(name) > CRD_TYPE_MAX_LENGTH:
                    name = name[:CRD_TYPE_MAX_LENGTH] + "..."
                types[name] = None
                break
    return list(types)


def filter_workloads(
    workloads: list[Obj], local_queue: str, cluster_queue: str, statuses: set[str]
) -> list[Obj]:
    """WorkloadOptions.filterList (--clusterqueue matches the admitted ClusterQueue only,
    as upstream's filterByClusterQueue)."""
    out = []
    for wl in workloads:
        if local_queue and wl["spec"].get("queueName") != local_queue:
            continue
        if cluster_queue and _admitted_cq(wl) != cluster_queue:
            continue
        if statuses and "all" not in statuses and workload_status(wl).lower() not in statuses:
            continue
        out.append(wl)
    return out


def cluster_queue_rows(queues: list[Obj], now: float) -> list[list[Any]]:
    return [
        [
            cq["metadata"]["name"],
            cq["spec"].get("cohortName", ""),
            (cq.get("status") or {}).get("pendingWorkloads", 0),
            (cq.get("status") or {}).get("admittedWorkloads", 0),
            _true(cq, api.CQ_ACTIVE),
            _age(cq, now),
        ]
        for cq in queues
    ]


def local_queue_rows(queues: list[Obj], now: float, with_namespace: bool) -> list[list[Any]]:
    rows = []
    for lq in queues:
        row = [
            lq["metadata"]["name"],
            lq["spec"].get("clusterQueue", ""),
            (lq.get("status") or {}).get("pendingWorkloads", 0),
            (lq.get("status") or {}).get("admittedWorkloads", 0),
            _age(lq, now),
        ]
        rows.append([lq["metadata"]["namespace"], *row] if with_namespace else row)
    return rows


# -- the commands ------------------------------------------------------------------------------


def _namespace(args: argparse.Namespace) -> str:
    if args.namespace:
        return str(args.namespace)
    path = args.kubeconfig or default_kubeconfig()
    try:
        _, current = config.list_kube_config_contexts(config_file=str(path) if path else None)
    except (config.ConfigException, OSError):
        return "default"
    return str((current or {}).get("context", {}).get("namespace") or "default")


def _print_name(obj: Obj, out: TextIO, operation: str = "") -> None:
    """kubectl's NamePrinter: ``<kind>.<group>/<name>[ <operation>]``."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"].lower()
    ref = (
        f"{kind}.{group}/{obj['metadata']['name']}"
        if group
        else f"{kind}/{obj['metadata']['name']}"
    )
    out.write(f"{ref} {operation}\n" if operation else f"{ref}\n")


def _dump(doc: Obj, output: str, out: TextIO) -> None:
    out.write(json.dumps(doc, indent=4) + "\n" if output == "json" else yaml.safe_dump(doc))


def _no_resources(args: argparse.Namespace, namespaced: bool) -> None:
    if namespaced and not args.all_namespaces:
        sys.stderr.write(f"No resources found in {_namespace(args)} namespace.\n")
    else:
        sys.stderr.write("No resources found\n")


def _list(args: argparse.Namespace, kc: Client, out: TextIO) -> int:
    now = time.time()
    what = args.resource
    namespaced = what != "clusterqueue"
    ns = None if (not namespaced or args.all_namespaces) else _namespace(args)
    plural = {"workload": "workloads", "clusterqueue": "clusterqueues", "localqueue": "localqueues"}
    items = kc.list(plural[what], ns, args.selector, args.field_selector)
    if what == "workload":
        statuses = {s.lower() for s in args.status or []}
        bad = statuses - set(STATUSES)
        if bad:
            raise CLIError(
                f"invalid status value ({sorted(bad)[0]}). "
                'Must be "all", "pending", "admitted" or "finished"'
            )
        items = filter_workloads(items, args.localqueue, args.clusterqueue, statuses)
    elif what == "localqueue" and args.clusterqueue:
        items = [lq for lq in items if lq["spec"].get("clusterQueue") == args.clusterqueue]
    elif what == "clusterqueue" and args.active is not None:
        items = [cq for cq in items if _true(cq, api.CQ_ACTIVE) == args.active]
    if args.output == "name":
        for item in items:
            _print_name(item, out)
        return 0
    if args.output:
        _dump(
            {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}, args.output, out
        )
        return 0
    if not items:
        _no_resources(args, namespaced)
        return 0
    all_ns = bool(getattr(args, "all_namespaces", False))
    if what == "workload":
        headers: Sequence[str] = WORKLOAD_COLUMNS
        rows = workload_rows(kc, items, now, all_ns)
    elif what == "clusterqueue":
        headers, rows = CLUSTER_QUEUE_COLUMNS, cluster_queue_rows(items, now)
    else:
        headers, rows = LOCAL_QUEUE_COLUMNS, local_queue_rows(items, now, all_ns)
    if all_ns:
        headers = ("Namespace", *headers)
    out.write(table(headers, rows))
    return 0


def stop_resume_patch(resource: str, stop: bool, keep_running: bool) -> Obj:
    """The merge patch upstream's stop/resume commands send."""
    if resource == "workload":
        return {"spec": {"active": not stop}}
    if not stop:
        return {"spec": {"stopPolicy": api.STOP_NONE}}
    return {"spec": {"stopPolicy": "Hold" if keep_running else "HoldAndDrain"}}


def _stop_resume(args: argparse.Namespace, kc: Client, out: TextIO) -> int:
    stop = args.verb == "stop"
    what = args.resource
    plural = {"workload": "workloads", "clusterqueue": "clusterqueues", "localqueue": "localqueues"}
    ns = None if what == "clusterqueue" else _namespace(args)
    obj = kc.get(plural[what], ns, args.name)
    patch = stop_resume_patch(what, stop, bool(getattr(args, "keep_already_running", False)))
    if args.dry_run == "client":
        obj = _merge(obj, patch)
    else:
        obj = kc.patch(plural[what], ns, args.name, patch, dry=args.dry_run == "server")
    # UpdateWorkloadActivationOptions prints "stopped"/"resumed"; the queue commands none
    operation = ("stopped" if stop else "resumed") if what == "workload" else ""
    if args.dry_run in ("client", "server"):
        operation = f"{operation} ({args.dry_run} dry run)".strip()
    if args.output in ("json", "yaml"):
        _dump(obj, args.output, out)
    else:
        _print_name(obj, out, operation)
    return 0


def _merge(obj: Obj, patch: Obj) -> Obj:
    out = dict(obj)
    for k, v in patch.items():
        out[k] = _merge(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


# -- the parser ---------------------------------------------------------------------------------


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1", "t"):
        return True
    if value.lower() in ("false", "0", "f"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {value!r}")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="path to the kubeconfig file")
    p.add_argument("-n", "--namespace", help="the namespace scope for this CLI request")
    p.add_argument("-o", "--output", choices=("json", "yaml", "name"), help="output format")


def build(parser: argparse.ArgumentParser) -> None:
    """kueuectl's command tree under ``parser``."""
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    lst = verbs.add_parser("list", help="Display resources")
    kinds = lst.add_subparsers(dest="resource", metavar="RESOURCE", required=True)
    wl = kinds.add_parser(
        "workload", aliases=["kwl", "kueueworkload", "kueueworkloads"], help="List Workload"
    )
    cq = kinds.add_parser("clusterqueue", aliases=["cq"], help="List ClusterQueues")
    lq = kinds.add_parser("localqueue", aliases=["lq"], help="List LocalQueue")
    for p, name in ((wl, "workload"), (cq, "clusterqueue"), (lq, "localqueue")):
        _common(p)
        p.set_defaults(handler=_list, resource=name)
        p.add_argument("-l", "--selector", default="", help="Selector (label query) to filter on")
        p.add_argument("--field-selector", default="", help="Selector (field query) to filter on")
    for p in (wl, lq):
        p.add_argument(
            "-A",
            "--all-namespaces",
            action="store_true",
            help="If present, list the requested object(s) across all namespaces.",
        )
        p.add_argument(
            "-c",
            "--clusterqueue",
            default="",
            help="Filter by cluster queue name which is associated with the resource.",
        )
    wl.add_argument(
        "-q",
        "--localqueue",
        default="",
        help="Filter by local queue name which is associated with the resource.",
    )
    wl.add_argument(
        "--status",
        action="append",
        help='Filter workloads by status. Must be "all", "pending", "admitted" or "finished"',
    )
    cq.add_argument(
        "--active",
        type=_bool,
        help="Filter by active status. Valid values: 'true' and 'false'.",
    )
    for verb, short in (("stop", "Stop the resource"), ("resume", "Resume the resource")):
        vp = verbs.add_parser(verb, help=short)
        sub = vp.add_subparsers(dest="resource", metavar="RESOURCE", required=True)
        for name, aliases in (
            ("workload", ["kueueworkload", "kueueworkloads", "kwl"]),
            ("localqueue", ["lq"]),
            ("clusterqueue", ["cq"]),
        ):
            p = sub.add_parser(name, aliases=aliases, help=f"{verb.title()} the {name}")
            _common(p)
            p.add_argument("name", metavar="NAME")
            p.add_argument(
                "--dry-run",
                default="none",
                choices=("none", "server", "client"),
                help='Must be "none", "server", or "client".',
            )
            if verb == "stop" and name != "workload":
                p.add_argument(
                    "--keep-already-running",
                    action="store_true",
                    help="Indicates whether to keep already running workloads.",
                )
            p.set_defaults(handler=_stop_resume, resource=name)


def run(args: argparse.Namespace) -> int:
    kc = Client(api_client(args.kubeconfig))
    try:
        return int(args.handler(args, kc, sys.stdout))
    except ApiException as exc:
        body = json.loads(exc.body or "{}") if exc.body else {}
        raise UserError(f"Error from server: {body.get('message') or exc.reason}") from None


def add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "kueuectl",
        help="kubectl kueue: list and stop/resume Workloads and queues (kueuectl v0.19.2)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    build(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    """``kubectl-kueue``: kubectl runs it for ``kubectl kueue ...``."""
    parser = argparse.ArgumentParser(prog="kubectl kueue", description=__doc__)
    build(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
