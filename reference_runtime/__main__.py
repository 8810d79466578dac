from reference_runtime import cli
raise SystemExit(cli.main())
