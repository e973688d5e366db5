#include "core/evidence.h"

#include <string>

#include "ditops/registry.h"

namespace ditops {

const std::vector<EvidenceRecord>& evidence_records() {
  static const std::vector<EvidenceRecord> records = {
#include "core/evidence_records.inc"
  };
  return records;
}

void attach_evidence(Registry& registry) {
  for (const EvidenceRecord& r : evidence_records()) {
    KernelSpec* spec = registry.find_mutable(r.implementation);
    if (!spec) continue;  // the evidence test reports records of unknown implementations
    const std::string kind = r.kind;
    if (kind == "promotion")
      spec->evidence = Evidence{r.shapes, r.oracle, r.tolerance, r.result, r.device, r.date, r.commit};
    else if (kind == "admission")
      spec->contract.admission = std::string(r.result) + " on " + r.shapes + " against " + r.oracle + " (" +
                                 r.device + ", " + r.date + " at " + r.commit + ")";
  }
}

}  // namespace ditops
