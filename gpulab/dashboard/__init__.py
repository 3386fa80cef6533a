"""`gpulab dashboard`: a live web page of GPUs, slices, queues, gangs and the call chain.

views.py    pure: API objects (dicts as the API server serves them) -> what a panel shows
chain.py    pure: trace Events -> caller -> callee calls -> a Mermaid sequence diagram
hub.py      one gpulab.informer.Informer per kind, indexes, a work queue of view keys,
            and the fan-out of changed views to every connected page
server.py   the Starlette app: the page, its vendored scripts, /api/stream (server-sent
            events), /api/explain; run by uvicorn on 127.0.0.1
commands.py `gpulab dashboard`
static/     the page (Preact + signals + htm, Mermaid; vendored by `make dashboard-web`)
web/        package.json / package-lock.json pinning those front-end packages
"""
