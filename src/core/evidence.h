// The evidence records of implementations, generated from the committed benchmark records by
// bench/evidence.py (src/core/evidence_records.inc; never typed by hand): promotion records of
// kda kernels and admission records of close implementations (docs/quality.md).
#pragma once

#include <vector>

namespace ditops {

class Registry;

struct EvidenceRecord {
  const char* implementation;  // "fp8_linear.kda_gemv"
  const char* kind;            // "promotion" or "admission"
  const char* shapes;
  const char* oracle;
  const char* tolerance;
  const char* result;  // promotion: the speed-up over the named baseline; admission: the error ratios
  const char* device;
  const char* date;
  const char* commit;
};

const std::vector<EvidenceRecord>& evidence_records();

// Fills KernelSpec::evidence (promotion) and Contract::admission (admission) of the registered
// implementations the records name.
void attach_evidence(Registry& registry);

}  // namespace ditops
