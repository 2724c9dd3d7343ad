// CPU fast path of the per-step vocabulary update: the same state transitions as the
// batched torch code in nanospec_server/vocab (window.py, union_head.py), written as plain
// sequential loops, which on a CPU beat dozens of small tensor ops. Plain C ABI, no torch
// headers: built with the system C++ compiler in a second and loaded with ctypes.
//
// Layouts (row-major, every row has one trailing "dump" entry the torch code writes into):
//   ring [S, W_cap+1] int64, length [S] int64, last_pos [S, V+1] int32,
//   members [S, W_cap+1] int64, in_set [S, V+1] bool, member_pos [S, W_cap+1] int32,
//   scanned [S, 2] int64 (the window
//   [start, end) each slot had at its last refresh: those positions need no second look),
//   ids [C+1] int64, row_of [V+1] int64, ref [V+1] int32, count [1] int64,
//   buf [C+1, d] and weight [V, d] of one dtype (copied as `row_bytes` raw bytes).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

struct Union {
  int64_t* ids;
  int64_t* row_of;
  int32_t* ref;
  int64_t* count;
  char* buf;
  int64_t buf_stride;
  const char* weight;
  int64_t weight_stride;
  int64_t row_bytes;
  int64_t capacity;
  int64_t overflow = 0;  // distinct new tokens that found no row (buffer full): not admitted
  // Tokens whose reference count touched 0 during this call, or that hold no row (refused
  // one earlier: they retry); settled at the end so a token that leaves one request and
  // enters another keeps its row.
  std::vector<int64_t> maybe_gone, maybe_new;

  void add_ref(int64_t token) {
    if (ref[token]++ == 0 || row_of[token] < 0) maybe_new.push_back(token);
  }
  void drop_ref(int64_t token) {
    if (--ref[token] == 0) maybe_gone.push_back(token);
  }
  void place(int64_t token, int64_t row, const char* source) {
    std::memcpy(buf + row * buf_stride, source, row_bytes);
    ids[row] = token;
    row_of[token] = row;
  }

  // Free rows of tokens no request holds, give rows to new tokens (holes first), then move
  // live rows stranded above the new count down, so rows [0, count) stay dense.
  void settle() {
    std::vector<int64_t> holes;
    for (int64_t token : maybe_gone) {
      if (ref[token] == 0 && row_of[token] >= 0) {
        holes.push_back(row_of[token]);
        ids[row_of[token]] = -1;
        row_of[token] = -1;
      }
    }
    std::sort(holes.begin(), holes.end());  // new tokens take the lowest holes
    int64_t next_row = *count;
    size_t next_hole = 0;
    constexpr int64_t kRefused = -2;  // refused this call: counted once however often listed
    for (int64_t token : maybe_new) {
      if (ref[token] > 0 && row_of[token] == -1) {
        if (next_hole == holes.size() && next_row == capacity) {
          ++overflow;  // never write past the buffer: the token stays out of the head
          row_of[token] = kRefused;
          continue;
        }
        const int64_t row = next_hole < holes.size() ? holes[next_hole++] : next_row++;
        place(token, row, weight + token * weight_stride);
      }
    }
    const int64_t new_count = next_row - static_cast<int64_t>(holes.size() - next_hole);
    int64_t source = next_row - 1;
    for (; next_hole < holes.size(); ++next_hole) {
      const int64_t hole = holes[next_hole];
      if (hole >= new_count) continue;
      while (ids[source] < 0) --source;  // a live row >= new_count exists for every hole
      place(ids[source], hole, buf + source * buf_stride);
      ids[source--] = -1;
    }
    *count = new_count;
    for (int64_t token : maybe_new) {
      if (row_of[token] == kRefused) row_of[token] = -1;
    }
    maybe_gone.clear();
    maybe_new.clear();
  }
};

}  // namespace

extern "C" {

// Append tokens[b, :] (where valid, or all if valid is null), in column order, to the
// streams of slots[b]. Returns how many tokens were outside [0, V) (those are skipped).
int64_t nanospec_append(int64_t batch, int64_t cols, const int64_t* slots, const int64_t* tokens,
                        const bool* valid, int64_t* ring, int64_t* length, int32_t* last_pos,
                        int64_t w_cap, int64_t vocab_size) {
  int64_t invalid = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t slot = slots[b];
    const int64_t* row = tokens + b * cols;
    const bool* row_valid = valid ? valid + b * cols : nullptr;
    int64_t count = 0;
    for (int64_t i = 0; i < cols; ++i) count += row_valid ? row_valid[i] : 1;
    // Only the last w_cap tokens of a long append can still be in the ring.
    const int64_t skip = count > w_cap ? count - w_cap : 0;
    int64_t* slot_ring = ring + slot * (w_cap + 1);
    int32_t* slot_last = last_pos + slot * (vocab_size + 1);
    int64_t position = length[slot];
    for (int64_t i = 0, k = 0; i < cols; ++i) {
      if (row_valid && !row_valid[i]) continue;
      const int64_t token = row[i];
      if (token < 0 || token >= vocab_size) {
        ++invalid;
        continue;
      }
      if (k++ >= skip) slot_ring[position % w_cap] = token;
      slot_last[token] = static_cast<int32_t>(position++);
    }
    length[slot] = position;
  }
  return invalid;
}

// Bring members/in_set of `slots` to their windows of `w_max[b]` positions (one per slot;
// or, if `release`, empty them) and apply the changes to the union head (of `capacity` rows).
// Returns how many distinct new tokens found no row in the union buffer (not admitted).
int64_t nanospec_refresh(int64_t batch, const int64_t* slots, const int64_t* w_max, int64_t w_cap,
                         int64_t vocab_size, bool release, const int64_t* ring,
                         const int64_t* length, const int32_t* last_pos, int64_t* members,
                         bool* in_set, int32_t* member_pos, int64_t* scanned, int64_t* ids, int64_t* row_of,
                         int32_t* ref, int64_t* count, char* buf, int64_t buf_stride,
                         const char* weight, int64_t weight_stride, int64_t row_bytes,
                         int64_t capacity) {
  Union head{ids, row_of, ref, count, buf, buf_stride, weight, weight_stride, row_bytes, capacity};
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t slot = slots[b];
    const int64_t* slot_ring = ring + slot * (w_cap + 1);
    const int32_t* slot_last = last_pos + slot * (vocab_size + 1);
    int64_t* slot_members = members + slot * (w_cap + 1);
    bool* slot_in = in_set + slot * (vocab_size + 1);
    const int64_t end = length[slot];
    const int64_t start = end > w_max[b] ? end - w_max[b] : 0;
    // Leave: members whose latest occurrence is out of the window. member_pos[j] is a
    // position of member j seen earlier; at or past `start` it proves the member stays, so
    // last_pos (a random access) is read only for members near the window's edge.
    int32_t* slot_member_pos = member_pos + slot * (w_cap + 1);
    for (int64_t j = 0; j < w_cap; ++j) {
      const int64_t token = slot_members[j];
      if (token < 0 || (!release && slot_member_pos[j] >= start)) continue;
      if (!release && slot_last[token] >= start) {
        slot_member_pos[j] = slot_last[token];
        continue;
      }
      slot_members[j] = -1;
      slot_in[token] = false;
      head.drop_ref(token);
    }
    if (release) continue;
    // Enter: distinct window tokens new to the set. Positions scanned at the last refresh
    // that are still in the window hold members already (a token leaves only once its
    // latest position is out), so only the rest of the window is read.
    int64_t* seen = scanned + 2 * slot;
    int64_t free_entry = 0;
    for (int64_t p = start; p < end; ++p) {
      if (p >= seen[0] && p < seen[1]) {
        p = seen[1] - 1;
        continue;
      }
      const int64_t token = slot_ring[p % w_cap];
      if (slot_last[token] != p || slot_in[token]) continue;
      while (slot_members[free_entry] >= 0) ++free_entry;
      slot_members[free_entry] = token;
      slot_member_pos[free_entry] = static_cast<int32_t>(p);
      slot_in[token] = true;
      head.add_ref(token);
    }
    seen[0] = start;
    seen[1] = end;
  }
  head.settle();
  return head.overflow;
}

}  // extern "C"
