from cudagraph_conformance.run import main

raise SystemExit(main())
