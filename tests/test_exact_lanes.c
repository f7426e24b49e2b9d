/* The integer-lane form of the exact sum (src/comm/exact_lanes.c), against
 * the binned sum it stands in for (src/comm/exact_sum.c, itself checked
 * against a big-integer reference in test_exact_sum):
 *
 *  1. Same bits: whenever every term fits the agreed window, the lane sum
 *     decodes (float64 and float32) to exactly the binned sum's bits, for
 *     windows at, above and below the largest term's top bin, in any order.
 *  2. Fit is exact: a term said to fit round-trips bit for bit through its
 *     lanes; a term said not to fit really has a bit outside the window
 *     (checked independently with frexp), or is inf/NaN.
 *  3. Adversarial mixes: every exponent from subnormal to DBL_MAX,
 *     cancellation to zero and to a tiny remainder, integer-valued terms
 *     (trailing zeros), signed zeros, up to SBN_XLANES_MAX_TERMS terms of
 *     the largest digits (the headroom).
 *  4. The block kernels equal the scalar reference: each instruction-set
 *     variant's encode (lanes and misfit count), misfits and decode give
 *     exactly the bits of sbn_xlanes_*_ref_* on random and adversarial
 *     arrays (every exponent, subnormals, signed zeros, inf/NaN, terms one
 *     bit inside and outside the window's edges, blocks mixing straight and
 *     exceptional values, rounding ties, results near FLT_MIN and overflow,
 *     lengths around the block size).
 * 1-3 run under every variant this CPU supports (a SKIP line for the
 * others). Prints the counts; exits non-zero on any failure. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/comm/exact_lanes.h"
#include "testutil.h"

static int failures;
#define FAIL(...) (fprintf(stderr, "FAIL: " __VA_ARGS__), failures++)

/* A term of the given binary exponent (x in [2^e, 2^(e+1)), clamped to
 * the double range), random sign and mantissa; some with trailing zeros. */
static double term(rng *r, int e) {
  if (e > 1023) e = 1023;
  double m = 1.0 + rng_uniform(r);
  if (rng_int(r, 0, 3) == 0) m = 1.0 + (double)rng_int(r, 0, 255) / 256.0; /* few low bits */
  double x = ldexp(m, e);
  return rng_int(r, 0, 1) ? -x : x;
}

/* Independent fit check: all bits of x within [38(T-2), 38(T+1)) in units
 * of 2^-1074. */
static int fits_ref(double x, int T) {
  if (!isfinite(x)) return 0;
  if (x == 0) return 1;
  int e;
  double f = frexp(fabs(x), &e); /* x = f 2^e, f in [0.5, 1) */
  const int lead = e - 1 + 1074;
  uint64_t m = (uint64_t)ldexp(f, 53); /* 53-bit integer: x = m 2^(e-53) */
  int low = e - 53 + 1074;
  while (!(m & 1)) m >>= 1, low++;
  return lead < 38 * (T + 1) && low >= 38 * (T - 2);
}

/* ---- 4. the block kernels against the scalar reference ---- */

enum { NMAX = 1000 };
static size_t compared, mismatches;

#define MISMATCH(...) (mismatches++ < 10 ? (void)FAIL(__VA_ARGS__) : (void)failures++)

static uint64_t bits_rand(rng *r, int nbits) { return nbits <= 0 ? 0 : rng_u64(r) >> (64 - nbits); }

static double dbl_of(uint64_t u) {
  double x;
  memcpy(&x, &u, 8);
  return x;
}

/* One value for window T: mostly straight (m's bit 0 at sh in [0, 61]),
 * else around the window's edges (sh = -1, 62, ... with few or many low
 * bits), or a special value. */
static double value_for(rng *r, int T, int mix) {
  const int pick = rng_int(r, 0, 99);
  if (pick < mix) { /* exceptional */
    switch (rng_int(r, 0, 7)) {
      case 0: return rng_int(r, 0, 1) ? 0.0 : -0.0;
      case 1: return dbl_of(bits_rand(r, 52) | (rng_u64(r) & (UINT64_C(1) << 63))); /* subnormal */
      case 2: return rng_int(r, 0, 1) ? INFINITY : -INFINITY;
      case 3: return dbl_of(UINT64_C(0x7ff8000000000000) | bits_rand(r, 51) | (rng_u64(r) & (UINT64_C(1) << 63)));
      case 4: return dbl_of(rng_u64(r)); /* any bits */
      default: break;
    }
  }
  /* sh: m's bit 0 in the window; straight for 0..61, the edges beyond */
  static const int edges[] = {-1, 0, 1, 56, 57, 58, 60, 61, 62, 63, -2, -30};
  int sh = pick < mix + 10 ? edges[rng_int(r, 0, (int)(sizeof edges / sizeof edges[0]) - 1)] : rng_int(r, 0, 61);
  int e = sh + 1 + 38 * T - 76; /* the biased exponent */
  if (e < 1 || e > 0x7fe) e = rng_int(r, 1, 0x7fe);
  uint64_t m = bits_rand(r, 52);
  if (rng_int(r, 0, 3) == 0) m &= ~UINT64_C(0) << rng_int(r, 1, 52); /* trailing zeros: may fit below the edge */
  return dbl_of((uint64_t)e << 52 | m | (rng_u64(r) & (UINT64_C(1) << 63)));
}

static void check_encode(const char *isa, const double *x, const float *xf, const uint8_t *top, size_t n) {
  static int64_t a[2 * NMAX + 2], b[2 * NMAX + 2];
  for (int f32 = 0; f32 <= 1; f32++) {
    memset(a, 0x5a, sizeof a), memset(b, 0xa5, sizeof b);
    const size_t ma = f32 ? sbn_xlanes_encode_f32(a, xf, top, n) : sbn_xlanes_encode_f64(a, x, top, n);
    const size_t mb = f32 ? sbn_xlanes_encode_ref_f32(b, xf, top, n) : sbn_xlanes_encode_ref_f64(b, x, top, n);
    const size_t fa = f32 ? sbn_xlanes_misfits_f32(xf, top, n) : sbn_xlanes_misfits_f64(x, top, n);
    compared += 2 * n + 2;
    if (ma != mb || fa != mb) MISMATCH("[%s] encode f%d, n = %zu: %zu misfits (misfits: %zu), reference %zu\n", isa,
                                       f32 ? 32 : 64, n, ma, fa, mb);
    for (size_t i = 0; i < n; i++)
      if (a[2 * i] != b[2 * i] || a[2 * i + 1] != b[2 * i + 1])
        MISMATCH("[%s] encode f%d of %a in window %d: lanes %lld %lld, reference %lld %lld\n", isa, f32 ? 32 : 64,
                 f32 ? (double)xf[i] : x[i], top[i], (long long)a[2 * i], (long long)a[2 * i + 1],
                 (long long)b[2 * i], (long long)b[2 * i + 1]);
  }
}

static void check_decode(const char *isa, const int64_t *lanes, const uint8_t *top, size_t n) {
  static double a[NMAX], b[NMAX];
  static float af[NMAX], bf[NMAX];
  memset(a, 0x5a, sizeof a), memset(b, 0xa5, sizeof b), memset(af, 0x5a, sizeof af), memset(bf, 0xa5, sizeof bf);
  sbn_xlanes_decode_f64(a, lanes, top, n);
  sbn_xlanes_decode_ref_f64(b, lanes, top, n);
  sbn_xlanes_decode_f32(af, lanes, top, n);
  sbn_xlanes_decode_ref_f32(bf, lanes, top, n);
  compared += 2 * n;
  for (size_t i = 0; i < n; i++) {
    if (memcmp(&a[i], &b[i], 8) != 0)
      MISMATCH("[%s] decode f64 of %lld %lld in window %d: %a, reference %a\n", isa, (long long)lanes[2 * i],
               (long long)lanes[2 * i + 1], top[i], a[i], b[i]);
    if (memcmp(&af[i], &bf[i], 4) != 0)
      MISMATCH("[%s] decode f32 of %lld %lld in window %d: %a, reference %a\n", isa, (long long)lanes[2 * i],
               (long long)lanes[2 * i + 1], top[i], (double)af[i], (double)bf[i]);
  }
}

/* A lane pair within the contract (|hi|, |lo| < 2^62, as sums of up to
 * SBN_XLANES_MAX_TERMS digits): the magnitude V of nb bits has a tie, a
 * near-tie or any bits below its float64 or float32 rounding position (or
 * any bits at all), and is split into hi 2^57 + lo canonically or not. */
static void lanes_for(rng *r, int64_t *l) {
  typedef unsigned __int128 u128;
  static const int edges[] = {53, 54, 55, 56, 57, 58, 62, 63, 64, 65, 114, 115, 116, 117, 118}; /* s = 0 to 1, ... */
  const int nb = rng_int(r, 0, 2) ? rng_int(r, 0, 118) : edges[rng_int(r, 0, (int)(sizeof edges / sizeof edges[0]) - 1)];
  u128 V = nb ? ((u128)rng_u64(r) << 64 | rng_u64(r)) >> (128 - nb) | (u128)1 << (nb - 1) : 0;
  const int q = nb - (rng_int(r, 0, 1) ? 53 : 24) - 1; /* the round bit */
  if (q >= 0 && rng_int(r, 0, 3)) {
    const u128 below = ((u128)1 << q) - 1;
    V = (V & ~below) | (u128)1 << q;
    switch (rng_int(r, 0, 3)) {
      case 0: break;                                                          /* a tie */
      case 1: V &= ~((u128)1 << q), V |= below; break;                        /* just below */
      case 2: if (q > 0) V |= (u128)1 << rng_int(r, 0, rng_int(r, 0, 1) && q > 4 ? 3 : q - 1); break; /* just above */
      default: V ^= (u128)rng_u64(r) & below; break;
    }
  }
  int64_t hi = (int64_t)(uint64_t)(V >> 57), lo = (int64_t)(uint64_t)(V & ((((u128)1) << 57) - 1));
  if (rng_int(r, 0, 1) == 0) { /* not canonical: lo negative or above 2^57, as lane sums are */
    const int64_t c = rng_int(r, -8, 8);
    hi -= c, lo += c * ((int64_t)1 << 57);
  }
  if (rng_int(r, 0, 1)) hi = -hi, lo = -lo;
  l[0] = hi, l[1] = lo;
}

/* A window for decoding: anywhere, or where float32 results underflow or
 * overflow (T about 20 to 34) or float64 ones overflow (T 50 to 55). */
static uint8_t top_for(rng *r) {
  switch (rng_int(r, 0, 3)) {
    case 0: return (uint8_t)rng_int(r, 18, 34);
    case 1: return (uint8_t)rng_int(r, 50, 55);
    case 2: return (uint8_t)rng_int(r, 0, 8);
    default: return (uint8_t)(rng_int(r, 0, 99) ? rng_int(r, 0, 56) : rng_int(r, 0, 255));
  }
}

static void check_blocks(const char *isa) {
  rng r = rng_seed(77);
  static double x[NMAX];
  static float xf[NMAX];
  static uint8_t top[NMAX];
  static int64_t lanes[2 * NMAX];
  static const size_t lens[] = {0, 1, 2, 63, 64, 65, 127, 128, 129, 1000};
  compared = mismatches = 0;
  size_t arrays = 0;
  for (int it = 0; it < 6000; it++) {
    const size_t n = it < 200 ? lens[it % 10] : (size_t)rng_int(&r, 0, NMAX);
    /* per array: how often a value is exceptional (0 %: all blocks straight) */
    const int mix = (int[]){0, 0, 1, 5, 30, 100}[rng_int(&r, 0, 5)];
    /* a third of the arrays in float32's range (windows 25 to 31 hold its
     * normal numbers; sums decode to normal floats for T 27 to 30) */
    const int f32 = rng_int(&r, 0, 2) == 0;
    const int T0 = f32 ? rng_int(&r, 25, 30) : rng_int(&r, 0, 56);
    const int spread = f32 ? rng_int(&r, 0, 1) : rng_int(&r, 0, 3) ? 0 : rng_int(&r, 0, 60);
    for (size_t i = 0; i < n; i++) {
      int T = T0 + rng_int(&r, 0, spread);
      if (mix && rng_int(&r, 0, 499) == 0) T = rng_int(&r, 0, 255); /* any byte */
      top[i] = (uint8_t)(mix ? (T > 255 ? 255 : T) : (T > 55 ? 55 : T));
      x[i] = value_for(&r, top[i], mix);
      /* float32 terms: the value rounded (straight or not), or any float bits */
      if (mix && rng_int(&r, 0, 9) == 0) {
        const uint32_t u = (uint32_t)rng_u64(&r);
        memcpy(&xf[i], &u, 4);
      } else {
        xf[i] = (float)x[i];
      }
    }
    check_encode(isa, x, xf, top, n);
    /* decode: the lane sum of a few ranks' terms (realistic), or any lanes */
    for (size_t i = 0; i < n; i++) {
      if (rng_int(&r, 0, 1)) {
        lanes_for(&r, &lanes[2 * i]);
        top[i] = mix ? top_for(&r) : (uint8_t)(f32 ? rng_int(&r, 27, 30) : rng_int(&r, 4, 55)); /* mix 0: straight */
      } else {
        int64_t acc[2] = {0, 0}, l[2];
        for (int p = rng_int(&r, 1, 8); p-- > 0;) {
          const double v = p ? value_for(&r, top[i], 0) : x[i];
          if (sbn_xlanes_encode_ref_f64(l, &v, &top[i], 1) == 0) acc[0] += l[0], acc[1] += l[1];
        }
        lanes[2 * i] = acc[0], lanes[2 * i + 1] = acc[1];
      }
    }
    check_decode(isa, lanes, top, n);
    arrays++;
    if (mismatches > 50) break;
  }
  printf("blocks [%s]: %zu arrays, %zu outputs compared with the scalar reference, %zu mismatches\n", isa, arrays,
         compared, mismatches);
}


static void check_set(const double *x, size_t n, int T, size_t *same, size_t *fallback) {
  sbn_xbin acc = sbn_xsum_zero();
  for (size_t i = 0; i < n; i++) sbn_xsum_add(&acc, x[i]);
  double want64;
  float want32;
  sbn_xsum_decode_f64(&want64, &acc, 1);
  sbn_xsum_decode_f32(&want32, &acc, 1);
  int64_t sum[2] = {0, 0}, rsum[2] = {0, 0};
  size_t bad = 0;
  uint8_t top = (uint8_t)T;
  for (size_t i = 0; i < n; i++) {
    int64_t l[2];
    const size_t mis = sbn_xlanes_encode_f64(l, &x[i], &top, 1);
    bad += mis;
    if (mis != (size_t)!fits_ref(x[i], T)) FAIL("fit of %a in window %d: %zu misfits, reference says %d\n", x[i], T, mis, fits_ref(x[i], T));
    if (!mis) {
      double back;
      sbn_xlanes_decode_f64(&back, l, &top, 1);
      if (memcmp(&back, &x[i], 8) != 0 && !(x[i] == 0 && back == 0))
        FAIL("round trip of %a in window %d gives %a\n", x[i], T, back);
    }
    sum[0] += l[0], sum[1] += l[1];
  }
  for (size_t i = n; i-- > 0;) { /* reverse order: integer sums, the same lanes */
    int64_t l[2];
    sbn_xlanes_encode_f64(l, &x[i], &top, 1);
    rsum[0] += l[0], rsum[1] += l[1];
  }
  if (memcmp(sum, rsum, sizeof sum) != 0) FAIL("lane sums depend on the order\n");
  if (sbn_xlanes_misfits_f64(x, (uint8_t[]){top}, 0) != 0) FAIL("misfits of nothing\n");
  if (bad) {
    (*fallback)++;
    return;
  }
  double got64;
  float got32;
  sbn_xlanes_decode_f64(&got64, sum, &top, 1);
  sbn_xlanes_decode_f32(&got32, sum, &top, 1);
  if (memcmp(&got64, &want64, 8) != 0 || memcmp(&got32, &want32, 4) != 0) {
    FAIL("window %d, %zu terms: lanes give %a / %a, binned sum %a / %a\n", T, n, got64, (double)got32, want64,
         (double)want32);
    return;
  }
  (*same)++;
}

static void check_binned(void) {
  rng r = rng_seed(20261123);
  const int failures0 = failures;
  size_t same = 0, fallback = 0, sets = 0;
  double x[SBN_XLANES_MAX_TERMS];
  for (int it = 0; it < 200000; it++) {
    const size_t n = (size_t)rng_int(&r, 1, SBN_XLANES_MAX_TERMS);
    const int e0 = rng_int(&r, -1074, 1023), spread = rng_int(&r, 0, 3) ? rng_int(&r, 0, 30) : rng_int(&r, 0, 120);
    for (size_t i = 0; i < n; i++) x[i] = term(&r, e0 - rng_int(&r, 0, spread));
    switch (rng_int(&r, 0, 7)) {
      case 0: /* cancellation: the negated terms again, exactly zero */
        for (size_t i = 0; i < n / 2; i++) x[n / 2 + i] = -x[i];
        break;
      case 1: /* cancellation leaving a tiny remainder */
        if (n >= 3) {
          for (size_t i = 0; i < (n - 1) / 2; i++) x[(n - 1) / 2 + i] = -x[i];
          x[n - 1] = ldexp(x[n - 1], -rng_int(&r, 0, 40));
        }
        break;
      case 2: /* signed zeros among the terms */
        x[rng_int(&r, 0, (int)n - 1)] = rng_int(&r, 0, 1) ? 0.0 : -0.0;
        break;
      case 3: /* a non-finite term: never fits */
        if (rng_int(&r, 0, 3) == 0) x[rng_int(&r, 0, (int)n - 1)] = rng_int(&r, 0, 1) ? INFINITY : NAN;
        break;
      default:
        break;
    }
    sbn_xbin acc = sbn_xsum_zero();
    for (size_t i = 0; i < n; i++)
      if (isfinite(x[i])) sbn_xsum_add(&acc, x[i]);
    const int Ttrue = sbn_xsum_top(&acc) < 0 ? 0 : sbn_xsum_top(&acc);
    int T = Ttrue + rng_int(&r, -1, 2);
    if (T < 0) T = 0;
    if (T > 55) T = 55;
    check_set(x, n, T, &same, &fallback);
    sets++;
    if (failures - failures0 > 20) break;
  }
  /* Headroom: the most terms, each the largest digits of the window. */
  for (int T = 0; T <= 55; T += 5) {
    for (int sign = -1; sign <= 1; sign += 2) {
      const double big = ldexp(1.0 - 0x1p-53, 38 * (T + 1) - 1074); /* all 53 bits just below the window top */
      for (int i = 0; i < SBN_XLANES_MAX_TERMS; i++) x[i] = isfinite(big) ? sign * big : sign * DBL_MAX;
      check_set(x, SBN_XLANES_MAX_TERMS, T, &same, &fallback);
      sets++;
    }
  }
  /* The batch entry points agree with one-at-a-time use. */
  {
    enum { N = 1000 };
    static double v[N], d[N];
    static float vf[N], df[N];
    static uint8_t tops[N];
    static int64_t lanes[2 * N];
    for (int i = 0; i < N; i++) {
      v[i] = term(&r, rng_int(&r, -1074, 1000));
      vf[i] = (float)term(&r, rng_int(&r, -149, 126));
      tops[i] = (uint8_t)((ilogb(v[i]) + 1074) / 38);
    }
    size_t mis = sbn_xlanes_encode_f64(lanes, v, tops, N);
    if (mis != sbn_xlanes_misfits_f64(v, tops, N) || mis) FAIL("batch encode: %zu misfits\n", mis);
    sbn_xlanes_decode_f64(d, lanes, tops, N);
    if (memcmp(d, v, sizeof v) != 0) FAIL("batch round trip (float64)\n");
    for (int i = 0; i < N; i++) tops[i] = (uint8_t)((ilogb(vf[i]) + 1074) / 38);
    mis = sbn_xlanes_encode_f32(lanes, vf, tops, N);
    if (mis != sbn_xlanes_misfits_f32(vf, tops, N) || mis) FAIL("batch encode (float32): %zu misfits\n", mis);
    sbn_xlanes_decode_f32(df, lanes, tops, N);
    if (memcmp(df, vf, sizeof vf) != 0) FAIL("batch round trip (float32)\n");
  }
  printf("exact lanes [%s]: %zu sets of up to %d terms: %zu fit their window and decode to the binned sum's bits, "
         "%zu have a term outside it (fallback); %d failures so far\n",
         sbn_xlanes_get_isa(), sets, SBN_XLANES_MAX_TERMS, same, fallback, failures);
}

int main(void) {
  const char *env = getenv("SYNCBN_CPU_ISA");
  printf("exact lanes: variant at first use %s (SYNCBN_CPU_ISA=%s)\n", sbn_xlanes_get_isa(), env ? env : "");
  int tested = 0;
  for (int i = 0; i < sbn_xlanes_isa_count(); i++) {
    const char *name = sbn_xlanes_isa_name(i);
    if (sbn_xlanes_set_isa(name) != 0) {
      if (sbn_xlanes_isa_supported(i)) FAIL("variant %s is supported but cannot be chosen\n", name);
      printf("SKIP variant %s: not supported by this CPU\n", name);
      continue;
    }
    if (strcmp(sbn_xlanes_get_isa(), name) != 0) FAIL("variant %s chosen, %s in use\n", name, sbn_xlanes_get_isa());
    check_binned();
    check_blocks(name);
    tested++;
  }
  if (sbn_xlanes_set_isa("no-such-isa") != -1) FAIL("an unknown variant was accepted\n");
  printf("exact lanes: %d variants tested; %d failures\n", tested, failures);
  return failures ? 1 : 0;
}
