from tasktrain.cli.main import main

raise SystemExit(main())
