"""The Multus semantics: what a pod gets, in which order, and the ADD/DEL/CHECK/STATUS/GC of a sandbox."""
