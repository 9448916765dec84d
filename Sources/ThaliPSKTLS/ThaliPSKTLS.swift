// ThaliPSKTLS: see spec/ and the module's types. (Module under construction.)
