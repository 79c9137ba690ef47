// The Estimate's JSON writer (io/estimate_json.cpp).
#pragma once

#include <string>

#include "gpumem/estimate.hpp"

namespace gpumem {

class JsonWriter;

constexpr int kEstimateSchemaVersion = 1;  // = kSchemaVersion of json.hpp

void WriteEstimate(JsonWriter& w, const Estimate& e);
// {"ok":true,"estimate":{…}}
std::string EstimateEnvelopeJson(const Estimate& e, int indent);
// {…} (the estimate alone)
std::string EstimateOnlyJson(const Estimate& e, int indent);

}  // namespace gpumem
