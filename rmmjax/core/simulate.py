"""Latent simulator: users with memory banks, queries with known relevance, a citation model
(its design: docs/implemented.md, Latent simulator)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from rmmjax.core.types import Batch, CoreSpec, check_positive_int


@dataclasses.dataclass(frozen=True)
class SimSpec:
  """Static description of the simulated world."""

  num_users: int = 64
  bank_size: int = 128  # memories per bank before padding (N)
  min_bank: int = 16  # smallest bank; sizes are uniform in [min_bank, bank_size]
  max_relevant: int = 3  # a query is about 1..max_relevant memories
  signal: float = 0.35  # weight of the undistorted direction, all the base retriever can use
  distortion: float = 1.0  # weight of the rotated direction, learnable by a reranker
  noise: float = 0.2  # weight of isotropic noise in the query
  world_seed: int = 0

  def __post_init__(self):
    for name in ("num_users", "bank_size", "min_bank", "max_relevant"):
      check_positive_int(name, getattr(self, name))
    if self.min_bank > self.bank_size:
      raise ValueError(f"min_bank={self.min_bank} > bank_size={self.bank_size}")
    if self.max_relevant > self.min_bank:
      raise ValueError(f"max_relevant={self.max_relevant} > min_bank={self.min_bank}")
    for name in ("signal", "distortion", "noise"):
      if not getattr(self, name) >= 0:
        raise ValueError(f"{name}={getattr(self, name)!r}: expected a value >= 0")


class World(struct.PyTreeNode):
  bank_UxNxD: jax.Array
  bank_size_U: jax.Array
  rotation_DxD: jax.Array  # the hidden distortion applied to query intents


def _normalize(x: jax.Array) -> jax.Array:
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def make_world(sim: SimSpec, dim: int) -> World:
  """The fixed world of a simulation, drawn from sim.world_seed."""
  k_bank, k_size, k_rot = jax.random.split(jax.random.PRNGKey(sim.world_seed), 3)
  bank = _normalize(jax.random.normal(k_bank, (sim.num_users, sim.bank_size, dim)))
  sizes = jax.random.randint(k_size, (sim.num_users,), sim.min_bank, sim.bank_size + 1)
  rotation, _ = jnp.linalg.qr(jax.random.normal(k_rot, (dim, dim)))
  pad = jnp.arange(sim.bank_size)[None, :] >= sizes[:, None]
  return World(bank_UxNxD=jnp.where(pad[..., None], 0.0, bank), bank_size_U=sizes,
               rotation_DxD=rotation)


def _sample_query(bank_NxD: jax.Array, valid_N: jax.Array, rotation_DxD: jax.Array,
                  u_N1: jax.Array, noise_D: jax.Array, sim: SimSpec, spec: CoreSpec) -> Batch:
  """One query about some of a bank's memories, with its base-retriever candidates; u_N1 holds
  N + 1 uniforms (which memories, then how many), noise_D standard normals."""
  n = bank_NxD.shape[0]
  # A uniform draw of distinct valid memories: the top of random keys over the valid ones.
  _, picks_R = jax.lax.top_k(jnp.where(valid_N, u_N1[:n], -1.0), sim.max_relevant)
  num_rel = 1 + jnp.minimum((u_N1[n] * sim.max_relevant).astype(jnp.int32), sim.max_relevant - 1)
  use_R = jnp.arange(sim.max_relevant) < num_rel
  intent_D = _normalize(jnp.sum(jnp.where(use_R[:, None], bank_NxD[picks_R], 0.0), 0))
  q_D = _normalize(sim.signal * intent_D + sim.distortion * rotation_DxD @ intent_D
                   + sim.noise * noise_D / jnp.sqrt(noise_D.shape[0]))
  base_N = jnp.where(valid_N, bank_NxD @ q_D, -jnp.inf)
  _, cand_K = jax.lax.top_k(base_N, spec.k)
  relevant_N = jnp.zeros((n,), bool).at[picks_R].set(use_R)
  return Batch(q_BxD=q_D, mem_BxKxD=bank_NxD[cand_K], mask_BxK=valid_N[cand_K],
               relevant_BxK=relevant_N[cand_K] & valid_N[cand_K], num_relevant_B=num_rel)


def sample_session(world: World, key: jax.Array, sim: SimSpec, spec: CoreSpec) -> Batch:
  """One user's session: spec.batch queries against that user's bank (a training batch). Its
  randomness is two draws (uniforms, normals): on a CPU each random-number kernel is a small
  loop, which should not dominate a simulated step."""
  k_uniform, k_normal = jax.random.split(key)
  num_users, n, d = world.bank_UxNxD.shape
  u = jax.random.uniform(k_uniform, (1 + spec.batch * (n + 1),))
  noise_BxD = jax.random.normal(k_normal, (spec.batch, d))
  user = jnp.minimum((u[0] * num_users).astype(jnp.int32), num_users - 1)
  bank_NxD = world.bank_UxNxD[user]
  valid_N = jnp.arange(n) < world.bank_size_U[user]
  return jax.vmap(_sample_query, in_axes=(None, None, None, 0, 0, None, None))(
      bank_NxD, valid_N, world.rotation_DxD, u[1:].reshape(spec.batch, n + 1), noise_BxD, sim,
      spec)


def sample_batch(world: World, key: jax.Array, sim: SimSpec, spec: CoreSpec,
                 sessions: int = 1) -> Batch:
  """`sessions` sessions of spec.batch queries each, flattened to sessions * spec.batch."""
  if sessions == 1:
    return sample_session(world, key, sim, spec)
  batches = jax.vmap(sample_session, in_axes=(None, 0, None, None))(
      world, jax.random.split(key, sessions), sim, spec)
  return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), batches)


def sample_eval_batch(world: World, sim: SimSpec, spec: CoreSpec, sessions: int) -> Batch:
  """A fixed set of held-out sessions, the same for every run in the same world."""
  key = jax.random.fold_in(jax.random.PRNGKey(sim.world_seed), 1_000_003)
  return sample_batch(world, key, sim, spec, sessions)


def simulate_citations(uniform_BxM: jax.Array, relevant_BxM: jax.Array, selected_BxM: jax.Array,
                       p_rel: jax.Array, p_irr: jax.Array) -> jax.Array:
  """Which selected memories the simulated generator cites: those whose uniform draw falls
  below p_rel (relevant) or p_irr (irrelevant); False where nothing was selected."""
  p_BxM = jnp.where(relevant_BxM, p_rel, p_irr)
  return (uniform_BxM < p_BxM) & (selected_BxM >= 0)
