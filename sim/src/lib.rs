//! The madsim simulation of stead. Filled in by the simulation work.
