"""The admin roles and their one ordering: viewer < release-manager < platform-admin.

Pure: a role held and a role needed in, a yes or no out. Each admin route declares the least role it
needs; every role above it may call it too.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"  # reads: who am I, the registry
    RELEASE_MANAGER = "release-manager"  # and changes releases: versions, routes, rollouts
    PLATFORM_ADMIN = "platform-admin"  # and manages admin tokens


# NOTE: the order of this tuple is the ordering; a new role goes where its powers put it.
ROLES_BY_RANK: tuple[Role, ...] = (Role.VIEWER, Role.RELEASE_MANAGER, Role.PLATFORM_ADMIN)
_RANK = {role: rank for rank, role in enumerate(ROLES_BY_RANK)}


def parse_role(text: str) -> Role:
    """The role named ``text``; ``ValueError`` listing the valid names otherwise."""
    try:
        return Role(text)
    except ValueError:
        valid = ", ".join(ROLES_BY_RANK)
        raise ValueError(f"unknown role {text!r}; valid roles: {valid}") from None


def role_allows(held: Role, needed: Role) -> bool:
    """Whether a principal holding ``held`` may do what needs ``needed`` (``held`` ranks at least as high)."""
    return _RANK[held] >= _RANK[needed]
