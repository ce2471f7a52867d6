// Host emulation of chunked_combine's thread mapping as on branch combine-registers (78f0e5f):
// two threads a row, M halves in registers a step ahead, S tiles with the halves of rows with
// bit 2 set swapped. Build: g++ -O2 -std=c++17 combine_mapping_emulation.cpp; prints ok (0 bad).
// It checks the chain against double, and tracks shared-memory races per barrier step,
// global ownership across blocks and threads, reads of unwritten memory and stray writes.
// A transcription of the kernel by hand: it checks the mapping, not the device's bits.
// Extended emulation: several sequences (u0 > 0), all K, V up to 256, race tracking on shared
// (per barrier epoch) and global (owner per address across blocks), read-before-init checks.
#include <cstdio>
#include <cmath>
#include <random>
#include <vector>
#include <cstdint>
#include <map>
int main() {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> U(-0.3f, 0.3f);
  long bad = 0;
  for (int K = 16; K <= 128; K += 16) for (int V : {16, 48, 128, 256}) {
    const int W = K + V, HV = 3;
    std::vector<int> nsegs = {1, 4, 2, 3, 7};
    const int N = nsegs.size();
    std::vector<long> offs(N + 1, 0);
    for (int n = 0; n < N; ++n) offs[n + 1] = offs[n] + nsegs[n];
    const long segments = offs[N];
    std::vector<float> ws((size_t)segments * HV * K * W);
    std::vector<char> init(ws.size(), 0);
    for (auto& x : ws) x = U(rng);
    // what the affine pass writes: B for ls < nseg-1, M for 1 <= ls < nseg-1
    for (int n = 0; n < N; ++n) for (int ls = 0; ls + 1 < nsegs[n]; ++ls) for (int j = 0; j < HV; ++j)
      for (int r = 0; r < K; ++r) for (int c = (ls == 0 ? K : 0); c < W; ++c) {
        size_t a = (((size_t)(offs[n] + ls) * HV + j) * K + r) * W + c;
        init[a] = 1;
        if (c < K) ws[a] = (r == c ? 0.9f : 0.f) + U(rng) / std::sqrt((float)K);
      }
    std::vector<float> orig = ws;
    std::vector<int> gw_owner(ws.size(), -1);  // (block*256+tid) that wrote
    std::vector<std::vector<int>> greaders(ws.size());
    const int C = 8, tiles = V / C;
    for (int blk = 0; blk < N * HV * tiles; ++blk) {
      const int ct = blk % tiles, pair = blk / tiles, j = pair % HV, n = pair / HV;
      const long u0 = offs[n], nseg = offs[n + 1] - offs[n];
      if (nseg < 3) continue;
      auto idx = [&](long s, int r, int c) { return (((size_t)(u0 + s) * HV + j) * K + r) * W + c; };
      float s_tile[2][128 * C];
      int sh_writer[2][128 * C]; int sh_wepoch[2][128 * C]; int sh_repoch_reader[2][128*C]; int sh_rep[2][128*C];
      for (int b = 0; b < 2; ++b) for (int i = 0; i < 128 * C; ++i) { sh_writer[b][i] = -1; sh_wepoch[b][i] = -1; sh_rep[b][i] = -1; sh_repoch_reader[b][i]=-1; }
      int epoch = 0;
      auto shw = [&](int b, int i, float v, int tid) {
        if (sh_wepoch[b][i] == epoch && sh_writer[b][i] != tid) { ++bad; }
        if (sh_rep[b][i] == epoch && sh_repoch_reader[b][i] != tid) { ++bad; printf("WAR shared\n"); }
        s_tile[b][i] = v; sh_writer[b][i] = tid; sh_wepoch[b][i] = epoch;
      };
      auto shr = [&](int b, int i, int tid) {
        if (sh_writer[b][i] < 0) { ++bad; printf("uninit shared K%d\n", K); }
        if (sh_wepoch[b][i] == epoch && sh_writer[b][i] != tid) { ++bad; printf("RAW shared race\n"); }
        sh_rep[b][i] = epoch; sh_repoch_reader[b][i] = tid;
        return s_tile[b][i];
      };
      auto gr = [&](size_t a, int tid) {
        if (!init[a]) { ++bad; printf("uninit global K%d V%d\n", K, V); }
        int me = blk * 256 + tid;
        if (gw_owner[a] >= 0 && gw_owner[a] != me) { ++bad; printf("cross-thread global RAW\n"); }
        greaders[a].push_back(me);
        return ws[a];
      };
      auto gw = [&](size_t a, float v, int tid) {
        int me = blk * 256 + tid;
        if (gw_owner[a] >= 0 && gw_owner[a] != me) { ++bad; printf("WAW global\n"); }
        for (int r : greaders[a]) if (r != me) { ++bad; printf("WAR global\n"); break; }
        gw_owner[a] = me; ws[a] = v;
      };
      const int pieces = K / 8;
      struct T { float m_now[16][4], m_next[16][4], b_now[4], b_next[4]; };
      std::vector<T> th(256);
      auto load = [&](int tid, long s, float (&m)[16][4], float (&b)[4]) {
        int row = tid >> 1, half = tid & 1; if (row >= K) return;
        for (int i = 0; i < 16; ++i) if (i < pieces) for (int e = 0; e < 4; ++e) m[i][e] = gr(idx(s, row, 4 * (2 * i + half) + e), tid);
        for (int e = 0; e < 4; ++e) b[e] = gr(idx(s, row, K + ct * C + 4 * half + e), tid);
      };
      for (int tid = 0; tid < 256; ++tid) {
        auto& t = th[tid];
        for (int i = 0; i < 16; ++i) for (int e = 0; e < 4; ++e) t.m_now[i][e] = t.m_next[i][e] = 0;
        for (int e = 0; e < 4; ++e) t.b_now[e] = t.b_next[e] = 0;
        int row = tid >> 1, half = tid & 1;
        if (row < K) for (int e = 0; e < 4; ++e) shw(0, row * C + 4 * (half ^ ((row >> 2) & 1)) + e, gr(idx(0, row, K + ct * C + 4 * half + e), tid), tid);
        load(tid, 1, t.m_now, t.b_now);
      }
      ++epoch;
      for (long s = 1; s + 1 < nseg; ++s) {
        static float part[256][8];
        // phase A (before shuffle): prefetch and partial sums; all reads
        for (int tid = 0; tid < 256; ++tid) {
          auto& t = th[tid]; int half = tid & 1;
          if (s + 2 < nseg) load(tid, s + 1, t.m_next, t.b_next);
          int b = (s - 1) & 1;
          for (int c = 0; c < 8; ++c) part[tid][c] = 0;
          for (int i = 0; i < 16; ++i) if (i < pieces) {
            int k = 4 * (2 * i + half);
            for (int e = 0; e < 4; ++e) for (int c = 0; c < 8; ++c) part[tid][c] = std::fma(t.m_now[i][e], shr(b, (k + e) * C + (c < 4 ? 4 * half : 4 * (half ^ 1)) + c % 4, tid), part[tid][c]);
          }
        }
        for (int tid = 0; tid < 256; ++tid) {
          auto& t = th[tid]; int row = tid >> 1, half = tid & 1;
          float out[4];
          for (int c = 0; c < 4; ++c) { float mine = part[tid][4 * half + c], theirs = part[tid ^ 1][4 * half + c]; out[c] = mine + theirs; }
          if (row < K) for (int c = 0; c < 4; ++c) {
            float nx = out[c] + t.b_now[c];
            gw(idx(s, row, K + ct * C + 4 * half + c), nx, tid);
            shw(s & 1, row * C + 4 * (half ^ ((row >> 2) & 1)) + c, nx, tid);
          }
        }
        ++epoch;
        for (auto& t : th) { for (int i = 0; i < 16; ++i) for (int e = 0; e < 4; ++e) t.m_now[i][e] = t.m_next[i][e]; for (int e = 0; e < 4; ++e) t.b_now[e] = t.b_next[e]; }
      }
    }
    double worst = 0;
    for (int n = 0; n < N; ++n) for (int j = 0; j < HV; ++j) {
      long nseg = nsegs[n];
      auto at = [&](const std::vector<float>& w, long s, int r, int c) { return w[(((size_t)(offs[n] + s) * HV + j) * K + r) * W + c]; };
      std::vector<double> S(K * V);
      for (int r = 0; r < K; ++r) for (int c = 0; c < V; ++c) S[r * V + c] = at(orig, 0, r, K + c);
      for (long s = 1; s + 1 < nseg; ++s) {
        std::vector<double> Sn(K * V);
        for (int r = 0; r < K; ++r) for (int c = 0; c < V; ++c) {
          double a = at(orig, s, r, K + c);
          for (int k = 0; k < K; ++k) a += (double)at(orig, s, r, k) * S[k * V + c];
          Sn[r * V + c] = a;
        }
        S = Sn;
        double dmax = 0, smax = 0;
        for (int r = 0; r < K; ++r) for (int c = 0; c < V; ++c) {
          dmax = std::max(dmax, std::fabs(S[r * V + c] - at(ws, s, r, K + c)));
          smax = std::max(smax, std::fabs(S[r * V + c]));
        }
        worst = std::max(worst, dmax / smax);
      }
    }
    // nothing outside the B columns of s in [1, nseg-2] changed
    for (int n = 0; n < N; ++n) for (long ls = 0; ls < nsegs[n]; ++ls) for (int j = 0; j < HV; ++j)
      for (int r = 0; r < K; ++r) for (int c = 0; c < W; ++c) {
        size_t a = (((size_t)(offs[n] + ls) * HV + j) * K + r) * W + c;
        bool may = ls >= 1 && ls + 1 < nsegs[n] && c >= K;
        if (!may && ws[a] != orig[a]) { ++bad; }
        if (may && gw_owner[a] < 0) { ++bad; printf("B not written\n"); }
      }
    if (worst > 1e-5) { ++bad; std::printf("K %d V %d worst %g\n", K, V, worst); }
  }
  std::printf("%s (%ld bad)\n", bad ? "FAIL" : "ok", bad);
  return bad != 0;
}
