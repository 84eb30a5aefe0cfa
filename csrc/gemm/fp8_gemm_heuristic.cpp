#include "gemm/fp8_gemm_heuristic.h"

#include <cstdint>
#include <sstream>

namespace snip::gemm {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool parse_tile(const std::string& v, int* tm, int* tn) {
  const auto x = v.find('x');
  if (x == std::string::npos) return false;
  try {
    size_t used = 0;
    *tm = std::stoi(v.substr(0, x), &used);
    if (used != x) return false;
    *tn = std::stoi(v.substr(x + 1), &used);
    return used == v.size() - x - 1 && *tm > 0 && *tn > 0;
  } catch (...) {
    return false;
  }
}

}  // namespace

bool parse_fp8_gemm_config(const std::string& text, Fp8GemmOverride* out, std::string* error) {
  *out = Fp8GemmOverride{};
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string key = eq == std::string::npos ? "tile" : item.substr(0, eq);
    const std::string val = eq == std::string::npos ? item : item.substr(eq + 1);
    if (key == "tile") {
      if (!parse_tile(val, &out->tile_m, &out->tile_n)) {
        *error = "bad tile '" + val + "' (expected e.g. 128x128)";
        return false;
      }
    } else if (key == "raster") {
      out->has_raster = true;
      if (val == "m") out->raster = Raster::kAlongM;
      else if (val == "n") out->raster = Raster::kAlongN;
      else if (val == "auto") out->raster = Raster::kHeuristic;
      else {
        *error = "bad raster '" + val + "' (expected m, n or auto)";
        return false;
      }
    } else if (key == "swizzle") {
      if (val == "1" || val == "2" || val == "4" || val == "8") out->swizzle = std::stoi(val);
      else {
        *error = "bad swizzle '" + val + "' (expected 1, 2, 4 or 8)";
        return false;
      }
    } else if (key == "cluster") {
      if (!parse_tile(val, &out->cluster_m, &out->cluster_n) || out->cluster_m > 2 || out->cluster_n > 2) {
        *error = "bad cluster '" + val + "' (expected e.g. 1x2 or 2x1)";
        return false;
      }
    } else if (key == "promotion") {
      if (val == "serial") out->promotion = Promotion::kSerial;
      else if (val == "overlapped") out->promotion = Promotion::kOverlapped;
      else {
        *error = "bad promotion '" + val + "' (expected serial or overlapped)";
        return false;
      }
    } else {
      *error = "unknown config key '" + key + "' (expected tile, raster, swizzle, promotion, cluster)";
      return false;
    }
  }
  return true;
}

Fp8GemmChoice choose_fp8_gemm_config(int m, int n, int k, const std::vector<TileCandidate>& candidates,
                                     int num_sms) {
  (void)k;
  Fp8GemmChoice best;
  if (num_sms <= 0) num_sms = 132;  // H100 SXM; only used for the wave estimate
  double best_score = -1.0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const TileCandidate& c = candidates[i];
    const int64_t tiles_m = ceil_div(ceil_div(m, c.tile_m), c.cluster_m) * c.cluster_m;
    const int64_t tiles_n = ceil_div(ceil_div(n, c.tile_n), c.cluster_n) * c.cluster_n;
    const int64_t waves = ceil_div(tiles_m * tiles_n, num_sms);
    const double useful = double(m) * double(n);
    const double launched = double(waves) * num_sms * c.tile_m * c.tile_n;
    const double score = (launched > 0 ? useful / launched : 0.0) * c.efficiency;
    if (score > best_score + 1e-9) {
      best_score = score;
      best.candidate = int(i);
    }
  }
  return best;
}

}  // namespace snip::gemm
