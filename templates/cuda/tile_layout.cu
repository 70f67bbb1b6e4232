{# How a template's shared-memory tiles are laid out and loaded, per
   instruction set (included after prelude.cu; needs `wgmma` and, with it,
   `wgmma_fns` in the template): padded or XOR-permuted rows (`tile_offset`) read by ldmatrix on sm_80,
   128-byte-swizzled panels read by wgmma on sm_90a. #}{% if wgmma %}{% include "cuda/prelude_sm90.cu" %}
#define LOAD_TILE load_tile_sw128
#define TILE_AT(base, ROWS, COLS, r, c) ((base) + sw128_index<ROWS>((r), (c)))
#define TILE_ADDR(base, ROWS, COLS, r, c) smem_at((base), sw128_index<ROWS>((r), (c)))
#define SYNC_SMEM_WRITES() (fence_proxy_async(), __syncthreads())
{{ wgmma_fns }}{% else %}#define LOAD_TILE load_tile
#define TILE_AT(base, ROWS, COLS, r, c) ((base) + tile_offset<COLS>((r), (c)))
#define TILE_ADDR(base, ROWS, COLS, r, c) smem_at((base), tile_offset<COLS>((r), (c)))
#define SYNC_SMEM_WRITES() __syncthreads()
{% endif %}
