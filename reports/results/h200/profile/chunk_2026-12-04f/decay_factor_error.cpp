// The prepass's decay weight w = base * exp(gi - gj) * rk, per element (old) against the
// factored form (base * exp(gi - gr)) * (exp(gr - gj) * rk), in fp32, vs long double.
#include <cmath>
#include <cstdio>
#include <random>
int main() {
  std::mt19937_64 rng(7);
  for (double scale : {0.01, 0.1, 1.0, 5.0, 20.0}) {  // per-token |g|
    std::uniform_real_distribution<double> U(0, scale);
    double worst_old = 0, worst_new = 0, rms_old = 0, rms_new = 0; long n = 0;
    for (int trial = 0; trial < 20000; ++trial) {
      double gam[64]; double acc = 0;
      for (int t = 0; t < 64; ++t) { acc += -(float)U(rng); gam[t] = acc; }  // sequential double sum of fp32 g
      int R = 1 + rng() % 3, row0 = 16 * R;
      for (int s = 0; s < 8; ++s) {
        int i = row0 + rng() % 16, j = rng() % row0;
        float base = 0.37f + (rng() % 1000) * 1e-3f, rk = 0.9f + (rng() % 1000) * 1e-4f;
        long double exact = (long double)base * expl((long double)gam[i] - gam[j]) * rk;
        if (exact < 1e-30L) continue;
        float w_old = base * (expf(float(gam[i] - gam[j])) * rk);
        float w_new = (base * expf(float(gam[i] - gam[row0]))) * (expf(float(gam[row0] - gam[j])) * rk);
        double e_old = fabsl((w_old - exact) / exact) / 5.96e-8, e_new = fabsl((w_new - exact) / exact) / 5.96e-8;
        worst_old = fmax(worst_old, e_old); worst_new = fmax(worst_new, e_new);
        rms_old += e_old * e_old; rms_new += e_new * e_new; ++n;
      }
    }
    printf("|g| up to %5.2f: %ld elements; relative error in fp32 ulps: old max %6.2f rms %5.2f | factored max %6.2f rms %5.2f\n",
           scale, n, worst_old, sqrt(rms_old / n), worst_new, sqrt(rms_new / n));
  }
}
