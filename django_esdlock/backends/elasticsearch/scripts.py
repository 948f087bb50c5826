"""The Painless scripts of the Elasticsearch backend, and what each guarantees.

Rules every script here keeps, so that it compiles and behaves the same on a
real Elasticsearch cluster (7.0, the suite's genuine node, to 9) and on the
noida-db test server:

- every value comes through ``params``; user data is never formatted into a
  source, so each script compiles once and is cached;
- no lambdas, no ``throw``, no ``return``: a refusal sets ``ctx.op = 'none'``
  and the caller reads the ``noop`` result;
- holder lists are rebuilt and assigned back to ``ctx._source`` instead of
  being changed in place (noida copies on read, Elasticsearch does not; a
  rebuilt list is right under both);
- numbers are read into ``long`` locals from ``def`` (no ``(Number)`` casts).

Expiry is judged by ``ctx._now``, the primary shard's clock. A holder that
expired without an ``intent`` is gone once ``params.lock_delay_ms`` (the lock
delay, often 0) has passed since its expiry: until then it still blocks
conflicting requests. One with an intent is kept, still blocks conflicting
requests and is left for the reaper to recover. The
intent (and the checkpoint) is kept on the holder's main node alone (its S
or X node): on its other nodes ``has_intent`` marks it, and counts the
same (``intent`` alone marks the holders of an older release).

Keep the sources short: noida-db parses a script on every execution, so its
cost grows with the source's code, executed or not. A real cluster compiles
each source once, but every request still carries it and the node reads it to
find the compiled script: :func:`compact` drops comment lines and indentation
before a source is sent (no comment follows code on a line, so that is safe).
"""

import functools


@functools.cache
def compact(source: str) -> str:
    """Return ``source`` as sent: without comment lines, blank lines and indentation."""
    lines = (line.strip() for line in source.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("//"))


CREATE = """
// Create a node that does not exist yet, with params.holder as its only holder
// (lease from ctx._now) and params.fresh as the rest of its source; a no-op
// when the node exists, which the caller then takes with ACQUIRE. Sent for a
// fresh node in place of a plain `create` where the grant pipeline cannot be
// used (see grants.py): a fraction of ACQUIRE's code.
if (ctx._source.isEmpty()) {
  long now = ctx._now;
  Map holder = new HashMap();
  holder.putAll(params.holder);
  holder.acquired_at = now;
  holder.expires_at = now + params.ttl_ms;
  ctx._source.putAll(params.fresh);
  ctx._source.holders = [holder];
} else {
  ctx.op = 'none';
}
"""

GRANT = """
// The script processor of the grant pipeline (see grants.py): the lease of
// each holder of a node created with a plain `create` starts at the ingest
// node's clock. The pipeline's set processor put that clock's reading,
// ZonedDateTime.toString() of _ingest.timestamp ("2026-11-26T14:08:17.066Z";
// the seconds and the fraction are left out when zero, the fraction has 3, 6
// or 9 digits), into lease_stamp: it is read here by hand into epoch
// milliseconds (days from the civil date), as noida-db's Painless has no
// java.time parsing. Each holder's lease_ms becomes acquired_at and
// expires_at; neither helper field is kept.
String t = ctx.remove('lease_stamp');
long y = Long.parseLong(t.substring(0, 4));
long mo = Long.parseLong(t.substring(5, 7));
long d = Long.parseLong(t.substring(8, 10));
long ms = Long.parseLong(t.substring(11, 13)) * 3600000L + Long.parseLong(t.substring(14, 16)) * 60000L;
if (t.length() > 17) {
  ms += Long.parseLong(t.substring(17, 19)) * 1000L;
}
int dot = t.indexOf('.');
if (dot > 0) {
  String fraction = t.substring(dot + 1, t.length() - 1) + '00';
  ms += Long.parseLong(fraction.substring(0, 3));
}
if (mo <= 2) {
  y -= 1;
}
long era = y / 400;
long yoe = y - era * 400;
long mp = mo > 2 ? mo - 3 : mo + 9;
long doe = yoe * 365 + yoe / 4 - yoe / 100 + (153 * mp + 2) / 5 + d - 1;
long now = (era * 146097 + doe - 719468) * 86400000L + ms;
List holders = new ArrayList();
for (def h : ctx.holders) {
  Map holder = new HashMap();
  holder.putAll(h);
  long lease = holder.remove('lease_ms');
  holder.acquired_at = now;
  holder.expires_at = now + lease;
  holders.add(holder);
}
ctx.holders = holders;
"""

# Recomputes the chapter's views of a node from `kept`; shared by the writers below.
_VIEWS = """
  boolean exclusive = false;
  List modes = new ArrayList();
  for (def h : kept) {
    if (h.mode == 'X') { exclusive = true; }
    if (!modes.contains(h.mode)) { modes.add(h.mode); }
  }
  ctx._source.holders = kept;
  ctx._source.lock_count = kept.size();
  if (kept.isEmpty()) {
    ctx._source.lock_type = null;
  } else if (exclusive) {
    ctx._source.lock_type = 'exclusive';
  } else {
    ctx._source.lock_type = 'shared';
  }
  ctx._source.modes = modes;
"""

# Keeps the live entries of `waiters` (except params.holder_id's) in `waiters`,
# and counts in `markers` those that are waiting markers, not release tombstones.
_LIVE_WAITERS = """
List waiters = new ArrayList();
int markers = 0;
if (ctx._source.waiters != null) {
  for (def w : ctx._source.waiters) {
    long waitUntil = w.expires_at;
    if (waitUntil > now && w.id != params.holder_id) {
      waiters.add(w);
      if (w.released == null) {
        markers++;
      }
    }
  }
}
"""

# Writes `kept` and `waiters` back, or deletes the node when no holder and no
# waiting marker is left (release tombstones do not keep a node).
_STORE_OR_DELETE = (
    """
if (kept.isEmpty() && markers == 0) {
  ctx.op = 'delete';
} else {
  ctx._source.waiters = waiters;
"""
    + _VIEWS
    + """
}
"""
)

ACQUIRE = (
    """
// Add params.holder to this node unless a live holder is in a mode of
// params.conflicts. A node the same owner already holds live in the same mode
// is reentered when params.reentrant (document locks): the node is written
// back unchanged, so the answer ("updated", with neither a holder nor a marker
// of this request) tells a reentry from a refusal's no-op, whatever the
// caller's clock says of its own entry's lease. A holder with the same id
// (the request was retried after a lost response) is replaced, never doubled.
//
// Fair waiting: a request that has waited carries params.ticket (its queue
// position) and, when refused, leaves a marker here that lasts
// params.marker_ttl_ms. A live marker in a conflicting mode refuses every
// request queued after it (no ticket, or a larger one), unless the
// requester already holds this node: so a stream of newcomers cannot starve
// a waiter, and waiters, ordered by ticket, cannot wait for each other. A
// refused request whose marker here still has over half its lease left writes
// nothing (a no-op): polling a busy node costs no write. A marker says who
// waits (params.waiter: host, pid, thread name and, when the owner holds other
// locks, `owner`, its key: the wait-for graph of deadlock detection), flat and
// nothing more: a busy node keeps one marker per waiting request, and every
// write rewrites them all. And
// `waiting_until` lets a search find nodes with live markers: it is the
// expiry of the latest marker written, so at least as late as any left.
//
// A release tombstone of params.holder.id (a give-back of this same request)
// is dropped: a tombstone never stands beside its holder, so it proves only
// the release that wrote it (see RELEASE).
//
// A holder whose lease ended less than params.lock_delay_ms ago (it was not
// released) still counts, as a live one in its mode would: the lock delay.
//
// A node that keeps params.max_holders holders refuses a new one, as a
// conflict would: Elasticsearch refuses a document with more nested objects
// than the index's `index.mapping.nested_objects.limit`.
//
// Intention entries left behind (protocol.py, "Ancestors"): params.gone
// lists [id, write, owner key] of entries that no longer hold; each is
// dropped only if it is still that write of that owner (a null matches
// any). They neither count nor refuse. Every write of an entry has its own
// number, and a holder taken over has another owner: an entry found gone is
// never confused with its rewrite.
//
// The first pass only decides; the lists to write are built only for a
// write: a refused poll of a busy node copies none of its markers (noida-db
// copies each entry added to a list, ~0.1 ms each).
long now = ctx._now;
long delay = params.lock_delay_ms;
long cut = now - delay;
Map gone = new HashMap();
if (params.gone != null) {
  for (def g : params.gone) {
    gone.put(g[0], g);
  }
}
Set dropped = new HashSet();
int held = 0;
boolean refused = false;
boolean reentered = false;
boolean inside = false;
if (ctx._source.holders != null) {
  for (def h : ctx._source.holders) {
    long expiresAt = h.expires_at;
    boolean live = expiresAt > now;
    boolean left = false;
    if (gone.containsKey(h.id)) {
      def g = gone.get(h.id);
      left = g[2] == null || g[2] == h.owner.key;
      if (left && g[1] != null) {
        left = false;
        if (h.write != null) {
          long read = g[1];
          long write = h.write;
          left = read == write;
        }
      }
      if (left) {
        dropped.add(h.id);
      }
    }
    if (h.id != params.holder.id && !left && (expiresAt > cut || h.intent != null || h.has_intent != null)) {
      held++;
      if (live && h.owner.key == params.holder.owner.key) {
        inside = true;
      }
      if (params.reentrant && live && h.owner.key == params.holder.owner.key && h.mode == params.holder.mode) {
        reentered = true;
      } else if (params.conflicts.contains(h.mode)) {
        refused = true;
      }
    }
  }
}
long markedUntil = 0;
if (ctx._source.waiters != null) {
  for (def w : ctx._source.waiters) {
    long waitUntil = w.expires_at;
    if (w.id == params.holder.id) {
      if (w.released == null) {
        markedUntil = waitUntil;
      }
    } else if (waitUntil > now && !inside && params.conflicts.contains(w.mode)) {
      if (params.ticket == null) {
        refused = true;
      } else {
        long theirs = w.ticket;
        long mine = params.ticket;
        if (theirs < mine) {
          refused = true;
        }
      }
    }
  }
}
if (!reentered && held >= params.max_holders) {
  refused = true;
}
// Semaphores (params.holder_limit; protocol.py, rule 5): the limit recorded
// on the node stands while any holder counts, else the request's. The
// counting holders and the live markers queued before this request (any
// mode; none where the requester is inside) must leave it a slot. A grant
// records the standing limit again.
long standing = 0;
if (params.holder_limit != null) {
  standing = params.holder_limit;
  if (held > 0 && ctx._source.holder_limit != null) {
    standing = ctx._source.holder_limit;
  }
  int ahead = 0;
  if (!inside && ctx._source.waiters != null) {
    for (def w : ctx._source.waiters) {
      long waitUntil = w.expires_at;
      if (w.id != params.holder.id && w.released == null && waitUntil > now) {
        if (params.ticket == null) {
          ahead++;
        } else {
          long theirs = w.ticket;
          long mine = params.ticket;
          if (theirs < mine) {
            ahead++;
          }
        }
      }
    }
  }
  if (held + ahead >= standing) {
    refused = true;
  }
}
if (reentered) {
  ctx.op = 'index';  // written back as it is (see above)
} else if (refused && params.ticket == null) {
  ctx.op = 'none';
} else if (refused && (markedUntil - now) * 2 > params.marker_ttl_ms) {
  ctx.op = 'none';
} else {
  List kept = new ArrayList();
  if (ctx._source.holders != null) {
    for (def h : ctx._source.holders) {
      long expiresAt = h.expires_at;
      boolean counts = expiresAt > cut || h.intent != null || h.has_intent != null;
      if (h.id != params.holder.id && !dropped.contains(h.id) && counts) {
        kept.add(h);
      }
    }
  }
  List waiters = new ArrayList();
  if (ctx._source.waiters != null) {
    for (def w : ctx._source.waiters) {
      long waitUntil = w.expires_at;
      if (w.id != params.holder.id && waitUntil > now) {
        waiters.add(w);
      }
    }
  }
  if (refused) {
    Map marker = new HashMap();
    marker.id = params.holder.id;
    marker.mode = params.holder.mode;
    marker.ticket = params.ticket;
    marker.putAll(params.waiter);
    marker.expires_at = now + params.marker_ttl_ms;
    waiters.add(marker);
    ctx._source.waiting_until = marker.expires_at;
  } else {
    Map holder = new HashMap();
    holder.putAll(params.holder);
    holder.acquired_at = now;
    holder.expires_at = now + params.ttl_ms;
    kept.add(holder);
    ctx._source.namespace = params.node.namespace;
    ctx._source.kind = params.node.kind;
    ctx._source.key = params.node.key;
    ctx._source.parent = params.node.parent;
    ctx._source.depth = params.node.depth;
    if (params.holder_limit != null) {
      ctx._source.holder_limit = standing;
    }
  }
  ctx._source.waiters = waiters;
"""
    + _VIEWS
    + """
}
"""
)

RELEASE = (
    """
// Remove the holder params.holder_id (and holders without an intent expired
// over params.lock_delay_ms ago); delete the node when no holder and no live
// waiting marker is left, as the chapter's release does. A no-op when the holder is not here, or was taken
// over by a reaper (its owner is no longer params.owner_key, unless that is
// null: a forced release).
//
// A node that stays keeps a release tombstone in `waiters` for
// params.tombstone_ms ({id, released: true, by: params.owner_key}; the newest
// params.tombstones_kept at most): a release that Elasticsearch re-executes on
// a new primary after the old one applied it finds its holder gone, and the
// backend reads the tombstone to tell its own release from a lost lock.
long now = ctx._now;
long delay = params.lock_delay_ms;
long cut = now - delay;
List kept = new ArrayList();
boolean removed = false;
for (def h : ctx._source.holders) {
  long expiresAt = h.expires_at;
  if (h.id == params.holder_id && (params.owner_key == null || h.owner.key == params.owner_key)) {
    removed = true;
  } else if (expiresAt > cut || h.intent != null || h.has_intent != null) {
    kept.add(h);
  }
}
"""
    + _LIVE_WAITERS
    + """
if (!removed) {
  ctx.op = 'none';
} else if (!kept.isEmpty() || markers > 0) {
  int drop = waiters.size() - markers - params.tombstones_kept + 1;
  List entries = new ArrayList();
  for (def w : waiters) {
    if (w.released != null && drop > 0) {
      drop--;
    } else {
      entries.add(w);
    }
  }
  Map tombstone = new HashMap();
  tombstone.id = params.holder_id;
  tombstone.released = true;
  tombstone.by = params.owner_key;
  tombstone.expires_at = now + params.tombstone_ms;
  entries.add(tombstone);
  waiters = entries;
}
if (removed) {
"""
    + _STORE_OR_DELETE
    + """
}
"""
)

WITHDRAW = (
    """
// Remove the waiting marker of params.holder_id (a request that gave up);
// delete the node if nothing else is left. A no-op when there is no marker.
long now = ctx._now;
boolean had = false;
if (ctx._source.waiters != null) {
  for (def w : ctx._source.waiters) {
    if (w.id == params.holder_id && w.released == null) {
      had = true;
    }
  }
}
List kept = new ArrayList();
if (ctx._source.holders != null) {
  kept.addAll(ctx._source.holders);
}
"""
    + _LIVE_WAITERS
    + """
if (!had) {
  ctx.op = 'none';
} else {
"""
    + _STORE_OR_DELETE
    + """
}
"""
)

RENEW = """
// Extend the lease of holder params.holder_id from now, record its fencing
// token and, when given, its checkpoint (sent for its main node alone) and
// recovery state. A no-op when the
// holder is gone, taken over by another owner, or its lease already ran out:
// an expired lease is never revived.
long now = ctx._now;
List kept = new ArrayList();
boolean renewed = false;
for (def h : ctx._source.holders) {
  long expiresAt = h.expires_at;
  if (h.id == params.holder_id && h.owner.key == params.owner_key && expiresAt > now) {
    Map copy = new HashMap();
    copy.putAll(h);
    copy.expires_at = now + params.ttl_ms;
    copy.token = params.token;
    if (params.checkpoint != null) {
      copy.checkpoint = params.checkpoint;
    }
    if (params.recovery != null) {
      copy.recovery = params.recovery;
    }
    kept.add(copy);
    renewed = true;
  } else {
    kept.add(h);
  }
}
if (renewed) {
  ctx._source.holders = kept;
} else {
  ctx.op = 'none';
}
"""

EVICT = (
    """
// Remove holders whose lease ran out more than params.grace_ms ago (the
// caller adds the lock delay) and that carry no intent, and expired waiting markers. A no-op when nothing goes.
// Never deletes the node, even left empty: the caller asks for the source
// back, and Elasticsearch 7.0 answers 500 to a scripted delete that was asked
// for its source; the caller deletes an emptied node with if_seq_no instead.
long now = ctx._now;
long cutoff = now - params.grace_ms;
List kept = new ArrayList();
for (def h : ctx._source.holders) {
  long expiresAt = h.expires_at;
  if (expiresAt > cutoff || h.intent != null || h.has_intent != null) {
    kept.add(h);
  }
}
"""
    + _LIVE_WAITERS
    + """
int before = ctx._source.waiters == null ? 0 : ctx._source.waiters.size();
if (kept.size() == ctx._source.holders.size() && waiters.size() == before) {
  ctx.op = 'none';
} else {
  ctx._source.waiters = waiters;
"""
    + _VIEWS
    + """
}
"""
)

TAKE_OVER = """
// Hand holder params.holder_id to params.owner with a fresh lease and the
// recovery state params.recovery; intent and checkpoint stay. With
// params.expected_owner_key set (the arbiter node, taken first) only a holder
// still owned by that key qualifies, and with params.require_expired only an
// expired one (a reaper's), with params.require_live only a live one (a
// hand-off's claim), with params.expected_expires_at only one whose lease is
// still that one (not renewed since it was read: a forced release): of two
// callers racing exactly one wins; a no-op otherwise.
long now = ctx._now;
List kept = new ArrayList();
boolean taken = false;
for (def h : ctx._source.holders) {
  long expiresAt = h.expires_at;
  boolean qualifies = h.id == params.holder_id;
  if (qualifies && params.expected_owner_key != null) {
    qualifies = h.owner.key == params.expected_owner_key && (expiresAt <= now || !params.require_expired)
      && (expiresAt > now || !params.require_live);
  }
  if (qualifies && params.expected_expires_at != null) {
    long expected = params.expected_expires_at;
    qualifies = expiresAt == expected;
  }
  if (qualifies) {
    Map copy = new HashMap();
    copy.putAll(h);
    copy.owner = params.owner;
    copy.expires_at = now + params.ttl_ms;
    copy.recovery = params.recovery;
    kept.add(copy);
    taken = true;
  } else {
    kept.add(h);
  }
}
if (taken) {
  ctx._source.holders = kept;
} else {
  ctx.op = 'none';
}
"""
