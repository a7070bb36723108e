// Config: a run's configuration as typed structs, one per section, each the options struct of the
// layer that uses it. config/config.h loads it from YAML; the schema (config/schema.h) declares
// every key of it, with its default: the structs' initialisers are only zero values.
#pragma once

#include <string>

#include "checkpoint/options.h"
#include "data/dataset.h"
#include "ddp/options.h"
#include "memory/options.h"
#include "models/model.h"
#include "train/options.h"

namespace config {

struct Config {
  std::string source;  // the file it came from
  models::ModelOptions model;
  data::DataOptions data;
  train::TrainOptions train;
  ddp::DdpOptions ddp;
  memory::MemoryOptions memory;
  checkpoint::CheckpointOptions checkpoint;
  train::LogOptions log;

  train::TrainerOptions trainer_options() const {
    return {.train = train,
            .ddp = ddp,
            .memory = memory,
            .checkpoint = checkpoint,
            .log = log,
            .loader = {.workers = data.workers,
                       .prefetch = data.prefetch,
                       .read_delay_ms = data.inject_read_delay_ms,
                       .pin_memory = false}};
  }
};

}  // namespace config
