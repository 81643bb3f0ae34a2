// gather_blocked / scatter_blocked and the transpose example's hooks run on the host
// (tests/blocked.rs): hooks.cuh's device code compiled by the host compiler, with stand-ins for
// the CUDA keywords and uint4. blocked.rs appends the source of examples/hooks/transpose.cu and
// then blocked_hooks_tests.cpp to this file.
//
// A chunk is moved as the collective moves it (collective.cuh, ChunkTiles::at): tile k has
// pos = k E, index = e0 + pos and the valid mask of the chunk's end; produce fills the wire,
// consume empties it into the output. Checked: the output is exactly what the hooks promise,
// every element of the chunks is read and written and nothing outside them is touched (the
// index functions are only asked for elements inside the chunk), and the fast paths take one
// 16-byte access per tile where they should.
#define __CUDACC__ 1
#define __host__
#define __device__
#define __forceinline__ inline
#include <cstdio>
#include <cstring>
#include <vector>

// Counts the 16-byte accesses of the hooks: the only copies of a uint4 are their vector loads
// and stores.
static long vector_ops = 0;
struct alignas(16) uint4 {
  unsigned x, y, z, w;
  uint4() = default;
  uint4(const uint4& o) : x(o.x), y(o.y), z(o.z), w(o.w) { ++vector_ops; }
  uint4& operator=(const uint4& o) {
    x = o.x;
    y = o.y;
    z = o.z;
    w = o.w;
    ++vector_ops;
    return *this;
  }
};

#include "devcomm/hooks.cuh"

using devcomm::Ctx;
using devcomm::Tile;
