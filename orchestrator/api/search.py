"""``POST /v1/search`` and the search page (``GET /``): the catalogues of the server's search roots.

The query is embedded once, as a query, by the server's own embedding worker of the settings' profile (the
warm worker ``/v1/embeddings`` uses), and each root's catalogue is searched with it
(:func:`orchestrator.catalogue.search.search`); the roots' hits are merged by score. The files of each root
are served under ``/outputs/<n>/``, so a hit links to its transcript page at its moment.
"""

from __future__ import annotations

import time
from pathlib import Path

from contracts.api import SearchHit, SearchRequest, SearchResponse
from contracts.errors import ApiError
from orchestrator.catalogue.query import QueryVector
from orchestrator.catalogue.search import Filters, SearchError, search
from orchestrator.settings import Settings

#: seconds the query's embedding may take (a cold worker loads its model first)
EMBED_TIMEOUT_S = 600.0


def run_search(settings: Settings, pool, body: SearchRequest) -> SearchResponse:
    """``body`` over every search root that has a catalogue (blocking: call it in a thread)."""
    started = time.perf_counter()
    roots = list(settings.search_roots)
    if not roots:
        raise ApiError(
            403,
            "this server searches no output folder: it was started without search roots (--search-root)",
            type="permission_error",
            code="no_search_roots",
        )
    embedded: dict[str, QueryVector] = {}

    def embed(text: str) -> QueryVector:
        if text not in embedded:
            result = pool.embed(settings.embedding_profile, [text], input_type="query").result(
                EMBED_TIMEOUT_S
            )
            embedded[text] = QueryVector(result.vectors[0], result.source_model or result.model)
        return embedded[text]

    filters = Filters(speaker=body.speaker, language=body.language, under=body.under, input=body.input)
    hits: list[SearchHit] = []
    model, unsearched, indexed = None, 0, 0
    for n, root in enumerate(roots):
        try:
            found = search(Path(root), body.query, embed, mode=body.mode, k=body.k, filters=filters)
        except SearchError as exc:
            if "no catalogue" in str(exc):
                continue  # a root not indexed yet: nothing to search there
            raise ApiError(400, str(exc), param="query", code="invalid_search") from None
        model = found.model or model
        unsearched += found.unsearched
        indexed += found.indexed
        hits.extend(
            SearchHit(
                **hit.model_dump(exclude={"link"}),
                root=n,
                folder=Path(root).name,
                url=f"/outputs/{n}/{hit.link}",
            )
            for hit in found.hits
        )
    hits.sort(key=lambda hit: -hit.score)
    return SearchResponse(
        query=body.query,
        mode=body.mode,
        hits=hits[: body.k],
        model=model,
        unsearched=unsearched,
        indexed=indexed,
        seconds=round(time.perf_counter() - started, 4),
    )


def search_page(settings: Settings) -> str:
    """The search page: a box, the mode and filters, and the hits with links to their moments."""
    from html import escape

    roots = "".join(
        f'<li><a href="/outputs/{n}/index.html">{escape(Path(root).name or str(root))}</a></li>'
        for n, root in enumerate(settings.search_roots)
    )
    return _PAGE.replace("{roots}", roots or "<li>none (start the server with --search-root OUT)</li>")


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Search the corpus</title>
<meta name="viewport" content="width=device-width,initial-scale=1">
<style>
body{font:16px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
form{display:flex;flex-wrap:wrap;gap:.5rem;margin:1rem 0}input,select,button{font:inherit;padding:.3rem .5rem}
#q{flex:1 1 20rem}.hit{margin:1rem 0}.hit .meta{color:#666;font-size:.9rem}mark{background:#ffe58a}
#status{color:#555}
</style></head><body>
<h1>Search the corpus</h1>
<p>Output folders:</p><ul id="roots">{roots}</ul>
<form id="search">
<input id="q" name="query" type="search" placeholder="words, a name, or what was meant" required>
<select id="mode" name="mode"><option value="hybrid">words and meaning</option><option value="words">words</option>
<option value="meaning">meaning</option></select>
<input id="speaker" name="speaker" placeholder="speaker (S0001 or a name)">
<input id="under" name="under" placeholder="under folder">
<button type="submit">Search</button></form>
<p id="status" role="status"></p><ol id="hits"></ol>
<script>
const form = document.getElementById('search');
const list = document.getElementById('hits');
const status = document.getElementById('status');
const field = name => document.getElementById(name).value.trim();
function marked(text) {
  const out = document.createDocumentFragment();
  for (const part of text.split(/(\\[[^\\]]*\\])/)) {
    if (part.startsWith('[') && part.endsWith(']')) {
      const m = document.createElement('mark');
      m.textContent = part.slice(1, -1);
      out.append(m);
    } else out.append(part);
  }
  return out;
}
function show(hit) {
  const li = document.createElement('li'), link = document.createElement('a');
  li.className = 'hit';
  link.href = hit.url;
  link.textContent = hit.input + ' at ' + hit.start.toFixed(1) + ' s';
  const meta = document.createElement('div'), text = document.createElement('div');
  meta.className = 'meta';
  meta.textContent = [hit.folder, hit.speaker, hit.language, 'score ' + hit.score.toFixed(3)]
    .filter(Boolean).join(' · ');
  text.append(marked(hit.marked));
  li.append(link, meta, text);
  list.append(li);
}
form.addEventListener('submit', async e => {
  e.preventDefault();
  list.replaceChildren();
  status.textContent = 'searching...';
  const body = {query: field('q'), mode: field('mode')};
  for (const name of ['speaker', 'under']) if (field(name)) body[name] = field(name);
  try {
    const r = await fetch('/v1/search', {
      method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
    const a = await r.json();
    if (!r.ok) { status.textContent = a.error ? a.error.message : r.statusText; return; }
    a.hits.forEach(show);
    const by = a.model ? ' by ' + a.model : '';
    const left = a.unsearched ? '; ' + a.unsearched + ' indexed with another model not searched by meaning' : '';
    status.textContent = a.hits.length + ' results (' + a.mode + by + ') in ' + a.indexed + ' inputs' + left;
  } catch (err) { status.textContent = 'search failed: ' + err; }
});
</script></body></html>
"""
