"""Tenants: a project's own scope over documents, vectors, graph and Dagster partitions.

Every document belongs to one tenant (documents.tenant_id, migration 0019). Content-hash deduplication and
idempotency keys hold per tenant, so the same file in two tenants is two documents. The tenant `default` is the
one every document registered before tenants existed belongs to: its document keys, storage keys and entity keys
stay as they were, so upgrading changes no key. Every other tenant's keys carry its name, which keeps Dagster
partition keys, stored files and graph entities of two tenants apart:

document key   <tenant>--<stem>-<hash8>       (`--` never occurs in a key of `default`: slugs collapse dashes)
storage key    tenants/<tenant>/documents/<hh>/<hash><ext>
entity key     <tenant>:<normalised name>     (normalised names hold no `:`)

DOCQUEUE_DEFAULT_TENANT names the tenant a command without --tenant means; the entry points read it and pass it
in, so this module reads no settings.
"""

from __future__ import annotations

import re

BASE_TENANT = "default"  # the column's default: documents from before tenants, keys unprefixed
TENANT_RULE = "1 to 63 characters of a-z, 0-9, `_` and `-`, starting with a letter or digit"
_TENANT = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")  # the CHECK of migration 0019 says the same


def tenant_problem(name: object) -> str | None:
    """Why `name` cannot be a tenant, as one sentence; None when it can."""
    if not isinstance(name, str) or not _TENANT.fullmatch(name):
        return f"invalid tenant {name!r}: a tenant name is {TENANT_RULE}"
    return None


def checked_tenant(name: str | None, default: str = BASE_TENANT) -> str:
    """The tenant itself (None: `default`, the caller's DOCQUEUE_DEFAULT_TENANT), or ValueError with one
    sentence."""
    if name is None:
        return default
    problem = tenant_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def tenant_document_key(tenant: str, key: str) -> str:
    return key if tenant == BASE_TENANT else f"{tenant}--{key}"


def tenant_storage_prefix(tenant: str) -> str:
    return "documents" if tenant == BASE_TENANT else f"tenants/{tenant}/documents"


def tenant_entity_key(tenant: str, key: str) -> str:
    return key if tenant == BASE_TENANT or not key else f"{tenant}:{key}"


def split_entity_key(key: str) -> tuple[str, str]:
    """(prefix, the normalised name) of an entity key; the prefix is "" for the base tenant's keys."""
    prefix, colon, name = key.partition(":")
    return (prefix, name) if colon else ("", key)


def bare_entity_key(key: str) -> str:
    """An entity key without its tenant prefix (what name rules such as short forms compare)."""
    return split_entity_key(key)[1]
